"""Weight-only quantization of an export (MatMulNBits): the manifest states parity vs fp32, the
ONNX Runtime engine runs the quantized graph, and edge–cloud output stays exact with it."""

from __future__ import annotations

import asyncio
import shutil

import numpy as np
import pytest
from transformers import AutoTokenizer

from rapid.core.geometry import causal_allowed
from rapid.core.manifest import load_manifest
from rapid.core.sampling import SamplingParams
from rapid.engines.ort_engine import OrtEngine
from rapid.export.quantize import QuantConfig, QuantizeError, quantize_export
from rapid.runtime.coordinator import Coordinator, CoordinatorConfig
from rapid.runtime.drafter import Drafter
from rapid.runtime.link import CloudLink
from rapid.runtime.policies import POLICIES
from rapid.runtime.tree import TreeParams
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.target import reference_decode
from rapid.tiny import EOS_ID


@pytest.fixture(scope="module")
def fp32_export(partial_onnx_export):
    return partial_onnx_export


@pytest.fixture(scope="module")
def int8_export(fp32_export, tmp_path_factory):
    out = tmp_path_factory.mktemp("int8-export") / "d"
    shutil.copytree(fp32_export, out)
    quantize_export(out, QuantConfig("int8", block_size=32), AutoTokenizer.from_pretrained(out))
    return out


@pytest.fixture(scope="module")
def dynamic_export(fp32_export, tmp_path_factory):
    out = tmp_path_factory.mktemp("int8-dynamic-export") / "d"
    shutil.copytree(fp32_export, out)
    quantize_export(out, QuantConfig("int8-dynamic"), AutoTokenizer.from_pretrained(out))
    return out


def test_manifest_states_parity_against_fp32(int8_export):
    q = load_manifest(int8_export)["quantization"]
    assert q["scheme"] == "int8" and q["bits"] == 8 and q["block_size"] == 32
    assert q["op"] == "com.microsoft.MatMulNBits"
    assert q["positions"] > 100 and 0.6 <= q["top1_vs_fp32"] <= 1.0
    assert not (int8_export / ".quantized").exists()


def test_dynamic_scheme_quantizes_weights_not_attention(dynamic_export):
    import onnx

    q = load_manifest(dynamic_export)["quantization"]
    assert q["scheme"] == "int8-dynamic" and q["bits"] == 8 and q["op"] == "MatMulInteger"
    assert "block_size" not in q and "accuracy_level" not in q  # MatMulNBits' settings: not this graph's
    assert q["positions"] > 100 and 0.6 <= q["top1_vs_fp32"] <= 1.0
    graph = onnx.load(str(dynamic_export / "draft.onnx"), load_external_data=False).graph
    ops = [n.op_type for n in graph.node]
    layers = load_manifest(dynamic_export)["architecture"]["layers"]
    assert ops.count("MatMulInteger") == 7 * layers  # q k v o gate up down per layer (the tiny LM head is tied)
    weights = {i.name for i in graph.initializer}
    left = [n for n in graph.node if n.op_type == "MatMul"]
    assert len(left) >= 2 * layers and not any(n.input[1] in weights for n in left)  # activation products: fp32
    assert "MatMulNBits" not in ops


@pytest.mark.parametrize("scheme", ["int8", "int8-dynamic"])
def test_quantized_engine_is_close_to_fp32(fp32_export, int8_export, dynamic_export, scheme):
    quantized = {"int8": int8_export, "int8-dynamic": dynamic_export}[scheme]
    ids = [int(x) for x in np.random.default_rng(0).integers(0, 256, 20)]
    a = OrtEngine(fp32_export, capacity=64, threads=1).step(ids, list(range(20)), causal_allowed(0, 20)).logits()
    b = OrtEngine(quantized, capacity=64, threads=1).step(ids, list(range(20)), causal_allowed(0, 20)).logits()
    assert a.shape == b.shape
    assert np.mean(a.argmax(-1) == b.argmax(-1)) >= 0.6
    assert not np.array_equal(a, b)  # it really is another graph


def test_refuses_a_quantized_or_bad_config(int8_export):
    with pytest.raises(QuantizeError, match="not a plain fp32 export"):
        quantize_export(int8_export, QuantConfig("int4", 32), AutoTokenizer.from_pretrained(int8_export))
    with pytest.raises(QuantizeError, match="power of two"):
        QuantConfig("int4", 48)
    with pytest.raises(QuantizeError, match="not one of"):
        QuantConfig("int3")


@pytest.mark.parametrize("scheme", ["int8", "int8-dynamic"])
def test_quantized_draft_keeps_output_exact(tiny_pair, int8_export, dynamic_export, scheme):
    target, _ = tiny_pair
    quantized = {"int8": int8_export, "int8-dynamic": dynamic_export}[scheme]
    server = BackgroundServer(VerifierServer(target))
    try:
        for policy in ("rapid", "edgellm"):
            for sampling in (SamplingParams(), SamplingParams(temperature=0.9, seed=4)):
                drafter = Drafter(OrtEngine(quantized, capacity=256, threads=1), TreeParams(4, 10, 2, 2), (EOS_ID,))
                coord = Coordinator(drafter, CloudLink(server.url), POLICIES[policy], CoordinatorConfig(depth=4))
                gen = asyncio.run(coord.generate(list(b"quantized"), 20, sampling))
                assert gen.tokens == reference_decode(target, list(b"quantized"), 20, sampling, (EOS_ID,))
    finally:
        server.close()


@pytest.mark.parametrize("extra, why", [(["--trt"], "use one of --quantize and --trt"),
                                        (["--dtype", "fp16"], "drop --dtype fp16"),
                                        (["--quantize", "int8-dynamic", "--quant-block", "32"], "drop --quant-block")])
def test_export_cli_refuses_what_quantization_cannot_honour(tmp_path, extra, why):
    import argparse

    from rapid.export.export_cli import add_arguments, run_from_args

    args = add_arguments(argparse.ArgumentParser()).parse_args(["x", "--out", str(tmp_path), "--quantize", "int4",
                                                                *extra])
    with pytest.raises(QuantizeError, match=why):
        run_from_args(args)
    assert not any(tmp_path.iterdir())  # refused before any work
