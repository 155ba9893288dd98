"""ONNX export round trips (tiny Qwen2 and tiny Llama) and the export's error messages."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from rapid.core.errors import RapidError
from rapid.core.manifest import input_names, load_manifest, output_names

MAX_CONTEXT, MAX_TREE = 128, 16


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    from rapid.tiny import build_tiny

    root = tmp_path_factory.mktemp("export-models")
    return {arch: build_tiny(root / arch, arch, seed=5) for arch in ("qwen2", "llama")}


@pytest.fixture(scope="session")
def exported(tiny_models, tmp_path_factory):
    """arch -> (model folder, export folder, returned manifest)."""
    from rapid.export.onnx_export import export_onnx

    out = {}
    for arch, model in tiny_models.items():
        d = tmp_path_factory.mktemp(f"export-{arch}")
        out[arch] = (model, d, export_onnx(str(model), d, max_context=MAX_CONTEXT, max_tree=MAX_TREE, progress=False))
    return out


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_round_trip_manifest(exported, arch):
    model, d, returned = exported[arch]
    m = load_manifest(d)
    assert m == json.loads(json.dumps(returned))  # what was returned is what was written
    assert (d / "draft.onnx").is_file() and not (d / "draft.onnx.data").exists()
    assert m["files"]["onnx_data"] is None
    a = m["architecture"]
    assert a["model_type"] == arch
    assert (a["layers"], a["kv_heads"], a["head_dim"], a["vocab"], a["hidden"]) == (2, 2, 16, 259, 64)
    assert m["dtype"] == "fp32" and m["max_context"] == MAX_CONTEXT and m["max_tree"] == MAX_TREE
    assert m["eos_token_ids"] == [256]
    assert m["present_kv"] == "new"
    assert [x["name"] for x in m["io"]["inputs"]] == input_names(2)
    assert [x["name"] for x in m["io"]["outputs"]] == output_names(2)
    assert m["io"]["outputs"][1]["shape"] == [1, 2, "T", 16]  # present = new entries only
    assert m["io"]["inputs"][2]["shape"] == [1, 1, "T", "P+T"]
    assert {"torch", "onnx", "onnxruntime", "transformers"} <= set(m["exporter"]["versions"])
    assert m["exporter"]["opset"] >= 17
    # provenance: sha256 of the local weights
    w = {x["file"]: x for x in m["model"]["weights"]}
    st = Path(model) / "model.safetensors"
    assert w["model.safetensors"]["sha256"] == hashlib.sha256(st.read_bytes()).hexdigest()
    assert m["model"]["resolved"] == str(model) and m["model"]["local"] is True
    # parity figures: all three steps, below the fp32 threshold
    p = m["parity"]
    assert p["ok"] and p["threshold"] == 1e-4
    assert {k: (v["T"], v["P"]) for k, v in p["cases"].items()} == {"prefill": (16, 0), "decode": (1, 16),
                                                                   "tree": (6, 17)}
    for case in p["cases"].values():
        assert 0 <= case["max_abs_diff"] < 1e-4 and case["top1_agree"] == 1.0
    assert set(m["timings_s"]) >= {"load", "export", "parity", "total"}


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tokenizer_copied(exported, arch):
    from transformers import AutoTokenizer

    model, d, m = exported[arch]
    assert "tokenizer.json" in m["files"]["tokenizer"]
    a, b = AutoTokenizer.from_pretrained(str(model)), AutoTokenizer.from_pretrained(str(d))
    text = "def f(x):\n    return x + 1  # é"
    assert a(text)["input_ids"] == b(text)["input_ids"]
    assert b.eos_token_id == 256


def test_dynamic_shapes_t1_p0_and_long(exported):
    """T = 1 with an empty past, and a long T, although the traced example had T = 3, P = 5."""
    import onnxruntime as ort

    _, d, m = exported["qwen2"]
    sess = ort.InferenceSession(str(d / "draft.onnx"), providers=["CPUExecutionProvider"])
    for t, p in ((1, 0), (1, 1), (40, 0), (2, 80)):
        feed = {"input_ids": np.zeros((1, t), np.int64), "position_ids": np.arange(p, p + t)[None],
                "attn_mask": np.zeros((1, 1, t, p + t), np.float32)}
        for name in input_names(2)[3:]:
            feed[name] = np.zeros((1, 2, p, 16), np.float32)
        outs = sess.run(None, feed)
        assert outs[0].shape == (1, t, 259)
        assert all(o.shape == (1, 2, t, 16) for o in outs[1:])
        assert np.isfinite(outs[0]).all()


def test_parity_failure_raises(exported):
    from rapid.export.parity import ParityError, run_parity
    from rapid.modeling import load_decoder

    model, d, _ = exported["llama"]
    decoder, _ = load_decoder(str(model))
    ok = run_parity(d / "draft.onnx", decoder)
    assert ok["ok"] and ok["max_abs_diff"] < 1e-4
    with pytest.raises(ParityError, match="parity"):
        run_parity(d / "draft.onnx", decoder, threshold=0.0)
    # the graph of another model (same shapes) disagrees by far more than the bound
    other, _ = load_decoder(str(exported["qwen2"][0]))
    bad = run_parity(d / "draft.onnx", other, raise_on_fail=False)
    assert not bad["ok"] and bad["max_abs_diff"] > 1e-2


# ---------------------------------------------------------------------------- errors --

def test_bad_model_path(tmp_path):
    from rapid.export.onnx_export import export_onnx

    with pytest.raises(RapidError, match="no-such-model"):
        export_onnx(str(tmp_path / "no-such-model"), tmp_path / "out", progress=False)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(RapidError, match="config.json"):
        export_onnx(str(empty), tmp_path / "out", progress=False)
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_unsupported_architecture(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from rapid.export.onnx_export import export_onnx
    from rapid.modeling import UnsupportedModelError

    folder = tmp_path / "gpt2"
    cfg = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=128)
    GPT2LMHeadModel(cfg).save_pretrained(folder)
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        export_onnx(str(folder), tmp_path / "out", progress=False)


def test_max_context_checks(tiny_models, tmp_path):
    from rapid.export.onnx_export import ExportError, export_onnx

    model = str(tiny_models["qwen2"])
    with pytest.raises(ExportError, match="--max-context 40 is too small"):
        export_onnx(model, tmp_path / "a", max_context=40, max_tree=64, progress=False)
    with pytest.raises(ExportError, match="max_position_embeddings"):
        export_onnx(model, tmp_path / "b", max_context=1 << 20, max_tree=64, progress=False)
    with pytest.raises(ExportError, match="dtype"):
        export_onnx(model, tmp_path / "c", dtype="int4", progress=False)


def test_out_dir_not_writable(tiny_models, tmp_path):
    from rapid.export.onnx_export import ExportError, export_onnx

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(ExportError, match="not writable"):
        export_onnx(str(tiny_models["qwen2"]), blocker / "out", progress=False, max_context=128, max_tree=16)


def test_cli_main_reports_errors(tmp_path, capsys):
    from rapid.export.export_cli import main

    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert "error:" in capsys.readouterr().err


def test_trt_build_without_tensorrt_is_a_clear_error(exported):
    from rapid.core.trt_support import PREFILL_CHUNK, missing_modules
    from rapid.export.trt_build import build_trt, profile_shapes

    shapes = profile_shapes(2048, 64)
    assert shapes["tree"]["T"] == (1, 8, 64) and shapes["prefill"]["T"][2] == PREFILL_CHUNK
    assert shapes["tree"]["P"][2] == 2047
    if "tensorrt" not in missing_modules():
        pytest.skip("tensorrt is installed here")
    with pytest.raises(RapidError, match="tensorrt") as err:
        build_trt(exported["qwen2"][1] / "draft.onnx")
    assert "Jetson" in str(err.value)


def test_manifest_loader_rejects_non_exports(tmp_path):
    from rapid.core.manifest import ManifestError

    with pytest.raises(ManifestError, match="does not exist"):
        load_manifest(tmp_path / "nope")
    with pytest.raises(ManifestError, match="manifest.json"):
        load_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text('{"format": "something-else"}')
    with pytest.raises(ManifestError, match="not a"):
        load_manifest(tmp_path)


def test_fp16_export_runs_on_ort_cpu(tmp_path):
    """fp16 graph (1-layer tiny model to stay fast): parity against fp32 PyTorch with the fp16 bound."""
    from rapid.core.geometry import causal_allowed
    from rapid.engines.ort_engine import OrtEngine
    from rapid.export.onnx_export import export_onnx
    from rapid.modeling import load_decoder
    from rapid.tiny import build_tiny

    model = build_tiny(tmp_path / "m", "qwen2", seed=2, layers=1)
    m = export_onnx(str(model), tmp_path / "x", dtype="fp16", max_context=64, max_tree=16, progress=False)
    assert m["dtype"] == "fp16" and m["io"]["inputs"][2]["dtype"] == "float16"
    p = m["parity"]
    assert p["ok"] and p["threshold_kind"].startswith("relative")
    for case in p["cases"].values():
        assert case["max_abs_diff"] <= case["bound"] and case["top1_agree"] == 1.0
    e = OrtEngine(tmp_path / "x", capacity=32)
    assert e.dtype == np.float16 and e.info.capacity == 32
    got = e.step([1, 2, 3], [0, 1, 2], causal_allowed(0, 3)).logits()
    assert got.dtype == np.float32 and np.isfinite(got).all()
    import torch

    from rapid.kvcache import StaticKV
    from rapid.modeling import additive_mask

    dec, _ = load_decoder(str(model))
    kv = StaticKV.for_config(dec.config, 8, torch.float32)
    kv.begin(3)
    with torch.inference_mode():
        ref = dec(torch.tensor([[1, 2, 3]]), torch.tensor([[0, 1, 2]]),
                  additive_mask(torch.as_tensor(causal_allowed(0, 3)), torch.float32), kv)[0].numpy()
    assert np.abs(got - ref).max() <= 2e-2 * max(1.0, np.abs(ref).max())
