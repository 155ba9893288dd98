"""``rapid.export.trt_build`` and ``trt_precision`` without TensorRT.

The precision check runs on real tiny exports (fp16 and fp32) and on fp16 graphs edited so a
norm, the softmax or the RoPE angles compute in fp16. ``build_trt`` runs against a stand-in
``tensorrt`` builder that records what it is asked for (network flags, builder flags, profiles)
and, like TensorRT, refuses a precision builder flag on a strongly typed network.
"""

from __future__ import annotations

import json
import shutil
import sys
import types

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from rapid.export.onnx_export import export_onnx
from rapid.export.trt_build import TrtBuildError, build_trt, main, profile_shapes
from rapid.export.trt_precision import PrecisionError, check_onnx_precision, fp16_violations
from rapid.tiny import build_tiny

STRONGLY_TYPED, FP16, TF32 = 0, 0, 6


@pytest.fixture(scope="session")
def exports(tmp_path_factory):
    """{"fp16": folder, "fp32": folder}: a 2-layer tiny Qwen2, max_context 64, max_tree 8."""
    root = tmp_path_factory.mktemp("trt-build")
    model = build_tiny(root / "model", "qwen2", seed=7)
    for dt in ("fp16", "fp32"):
        export_onnx(str(model), root / dt, dtype=dt, max_context=64, max_tree=8, progress=False)
    return {dt: root / dt for dt in ("fp16", "fp32")}


class _Input:
    def __init__(self, vi):
        self.name = vi.name
        self.shape = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in vi.type.tensor_type.shape.dim)


class _Network:
    def __init__(self, flags):
        self.flags, self.inputs = flags, []

    @property
    def num_inputs(self):
        return len(self.inputs)

    def get_input(self, i):
        return self.inputs[i]


class _Parser:
    num_errors = 0

    def __init__(self, network, logger):
        self.network = network

    def parse_from_file(self, path):
        self.network.inputs = [_Input(i) for i in onnx.load(path, load_external_data=False).graph.input]
        return True


class _Profile:
    def __init__(self):
        self.shapes, self.valid = {}, True

    def set_shape(self, name, lo, opt, hi):
        self.valid &= all(a <= b <= c for a, b, c in zip(lo, opt, hi, strict=True))
        self.shapes[name] = (tuple(lo), tuple(opt), tuple(hi))


class _Config:
    def __init__(self):
        self.flags, self.profiles = {TF32}, []  # TensorRT enables TF32 by default

    def set_flag(self, f):
        self.flags.add(f)

    def clear_flag(self, f):
        self.flags.discard(f)

    def set_memory_pool_limit(self, pool, size):
        pass

    def create_timing_cache(self, data):
        return types.SimpleNamespace(serialize=lambda: b"timing")

    def set_timing_cache(self, cache, ignore_mismatch):
        self.cache = cache
        return True

    def get_timing_cache(self):
        return self.cache

    def add_optimization_profile(self, p):
        self.profiles.append(p)
        return len(self.profiles) - 1 if p.valid else -1


class _Builder:
    record: dict  # set on the per-test subclass

    def __init__(self, logger):
        pass

    def create_network(self, flags):
        return _Network(flags)

    def create_builder_config(self):
        return _Config()

    def create_optimization_profile(self):
        return _Profile()

    def build_serialized_network(self, network, config):
        self.record.update(network=network, config=config)
        if network.flags & (1 << STRONGLY_TYPED) and FP16 in config.flags:
            return None  # TensorRT: precision flags are not allowed on strongly typed networks
        return b"serialized engine"


def _fake_builder(record: dict) -> types.ModuleType:
    trt = types.ModuleType("tensorrt")
    trt.__version__ = "10.3.0-emulated"
    trt.Logger = type("Logger", (), {"INFO": 3, "WARNING": 2, "__init__": lambda self, level=2: None})
    trt.Builder, trt.OnnxParser = type("Builder", (_Builder,), {"record": record}), _Parser
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(STRONGLY_TYPED=STRONGLY_TYPED)
    trt.BuilderFlag = types.SimpleNamespace(FP16=FP16, TF32=TF32)
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE=0)
    return trt


@pytest.fixture
def builder(monkeypatch):
    record: dict = {}
    monkeypatch.setitem(sys.modules, "tensorrt", _fake_builder(record))
    return record


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
def test_build_is_strongly_typed_in_the_graphs_precision(exports, builder, tmp_path, dtype):
    folder = shutil.copytree(exports[dtype], tmp_path / dtype)
    entry = build_trt(folder)
    assert builder["network"].flags & (1 << STRONGLY_TYPED)
    assert builder["config"].flags == set()  # no FP16 flag (types come from the graph), TF32 cleared
    assert (entry["precision"], entry["fp16"], entry["strongly_typed"], entry["tf32"]) == (dtype, dtype == "fp16",
                                                                                           True, False)
    prefill, tree = builder["config"].profiles
    assert prefill.shapes["input_ids"] == ((1, 1), (1, 64), (1, 64))  # T max = min(PREFILL_CHUNK, C)
    assert tree.shapes["attn_mask"] == ((1, 1, 1, 1), (1, 1, 8, 40), (1, 1, 8, 64))
    assert tree.shapes["past_key_1"][2] == (1, 2, 63, 16)
    assert json.loads((folder / "manifest.json").read_text())["trt"] == entry
    assert (folder / "draft.engine").read_bytes() == b"serialized engine"


def test_prefill_profile_stops_at_the_chunk():
    shapes = profile_shapes(2048, 64)
    assert shapes["prefill"] == {"T": (1, 128, 256), "P": (0, 0, 2047), "S": (1, 128, 2048)}
    assert profile_shapes(2048, 64, prefill_chunk=512)["prefill"]["T"] == (1, 128, 512)
    assert profile_shapes(100, 16)["prefill"]["T"] == (1, 100, 100)


def test_a_precision_the_graph_does_not_have_is_refused(exports, builder, capsys):
    with pytest.raises(TrtBuildError):
        build_trt(exports["fp32"], fp16=True)
    with pytest.raises(TrtBuildError):
        build_trt(exports["fp16"], fp16=False)
    assert "network" not in builder  # refused before anything was built
    assert main([str(exports["fp16"]), "--fp32"]) == 2
    assert capsys.readouterr().err.startswith("rapid-trt-build: error: ")  # as every rapid command


def test_the_exports_keep_norms_rope_and_softmax_in_fp32(exports):
    assert check_onnx_precision(exports["fp16"] / "draft.onnx") == "fp16"
    assert check_onnx_precision(exports["fp32"] / "draft.onnx") == "fp32"
    model = onnx.load(str(exports["fp16"] / "draft.onnx"), load_external_data=False)
    assert fp16_violations(model) == []
    ops = {n.op_type for n in model.graph.node}
    assert {"Pow", "ReduceMean", "Reciprocal", "Softmax", "Cos", "Sin"} <= ops  # the rules have work to do


def _retype_cast_before(model: onnx.ModelProto, op: str) -> str:
    """Make the first Cast-to-fp32 feeding an ``op`` node cast to fp16; re-infer all types."""
    producer = {o: n for n in model.graph.node for o in n.output}
    target = next(n for n in model.graph.node if n.op_type == op)
    cast = producer[target.input[0]]
    assert cast.op_type == "Cast"
    next(a for a in cast.attribute if a.name == "to").i = TensorProto.FLOAT16
    del model.graph.value_info[:]
    return target.name


@pytest.mark.parametrize("op", ["Pow", "Softmax"])
def test_an_fp16_norm_or_softmax_is_refused(exports, tmp_path, op):
    model = onnx.load(str(exports["fp16"] / "draft.onnx"))
    name = _retype_cast_before(model, op)
    path = tmp_path / "draft.onnx"
    onnx.save(model, str(path))
    bad = fp16_violations(onnx.load(str(path)))
    assert any(v.startswith(f"{name} ({op})") for v in bad)
    with pytest.raises(PrecisionError):
        check_onnx_precision(path)


def test_fp16_rope_angles_are_refused(tmp_path):
    """positions -> Cast(fp16) -> Mul(inv_freq) -> Cos: the angle itself is fp16."""
    inv = helper.make_tensor("inv_freq", TensorProto.FLOAT16, [4], np.ones(4, np.float16).tobytes(), raw=True)
    nodes = [helper.make_node("Cast", ["position_ids"], ["p16"], to=TensorProto.FLOAT16, name="cast"),
             helper.make_node("Unsqueeze", ["p16", "axes"], ["p3"], name="unsq"),
             helper.make_node("Mul", ["p3", "inv_freq"], ["angle"], name="angle_mul"),
             helper.make_node("Cos", ["angle"], ["cos"], name="cos"),
             helper.make_node("Add", ["cos", "attn_mask"], ["out"], name="add")]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [2])
    graph = helper.make_graph(nodes, "rope", [
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, 3]),
        helper.make_tensor_value_info("attn_mask", TensorProto.FLOAT16, [1, 3, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT16, [1, 3, 4])], [inv, axes])
    path = tmp_path / "rope.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)]), str(path))
    bad = fp16_violations(onnx.load(str(path)))  # no value_info: types come from ONNX inference
    assert {v.split(" ")[0] for v in bad} == {"cos", "angle_mul", "unsq", "cast"}  # back to the int positions
    with pytest.raises(PrecisionError):
        check_onnx_precision(path)
