"""One conformance suite for every draft backend (torch, onnx staged/window, trt when present).

A tiny random Qwen2 checkpoint is built and exported to ONNX once per session; each backend must
reproduce the PyTorch ``Decoder`` (prefill, decode, tree), keep its cache bit-identical across
a boundary save → expand → restore (truncate), and give the same logits after ``compact`` as a
fresh run over the kept path.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
from trt_emulation import _install_trt_emulation

from rapid.core.errors import RapidError
from rapid.core.geometry import causal_allowed
from rapid.engines.base import DraftEngine, EngineInfo, StepInputError
from rapid.export.parity import tree_allowed

CAPACITY = 64
ATOL = 1e-4
# trt-emu*: TrtEngine itself (buffers, staging/present copies, profiles, chunking, compaction)
# over stand-ins for tensorrt and pycuda that keep "device" memory on the host and execute the
# exported graph with ONNX Runtime; -kernels compacts with the native CUDA ABI's host emulation.
BACKENDS = ["torch", "onnx", "onnx-window", "trt", "trt-emu", "trt-emu-kernels"]
PARENTS = [-1, 0, 0, 1, 2, 3]  # two branches: 0-1-3-5 and 0-2-4
PATH = [0, 1, 3, 5]


@pytest.fixture(scope="session")
def reference(tiny_export):
    from rapid.modeling import load_decoder

    decoder, _ = load_decoder(str(tiny_export[0]))
    return decoder


@pytest.fixture(scope="session")
def trt_export(tiny_export):
    """The export folder with a TensorRT engine built into it (only where TensorRT runs)."""
    from rapid.engines.select import trt_available

    ok, why = trt_available()
    if not ok:
        pytest.skip(f"TensorRT backend unavailable: {why} (needs an NVIDIA GPU with TensorRT 10 + pycuda; "
                    "on a Jetson: JetPack's tensorrt and `pip install pycuda`)")
    from rapid.export.trt_build import build_trt

    build_trt(tiny_export[1] / "draft.onnx", fp16=False)
    return tiny_export[1]


@pytest.fixture(params=BACKENDS)
def engine_factory(request, tiny_export):
    from rapid.engines.select import open_engine

    kind = request.param
    model, export = tiny_export
    if kind == "trt":
        export = request.getfixturevalue("trt_export")
    if kind.startswith("trt-emu"):
        export = _install_trt_emulation(request.getfixturevalue("monkeypatch"), export,
                                        request.getfixturevalue("tmp_path"), kernels=kind.endswith("kernels"))

    def make():
        if kind == "torch":
            return open_engine("torch", model, CAPACITY, dtype="float32")  # compared across backends
        if kind == "onnx":
            return open_engine("onnx", export, CAPACITY)
        if kind == "onnx-window":
            return open_engine("onnx", export, CAPACITY, kv_binding="window")
        if kind == "trt-emu":  # small chunks: long prefills run as several enqueues
            return open_engine("trt", export, CAPACITY, chunk=8)
        return open_engine("trt", export, CAPACITY)

    make.kind = kind.split("-")[0]
    return make


def _prompt(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n)


def _ref_steps(decoder, steps):
    """Logits [T, V] of each (tokens, positions, allowed) step on the PyTorch Decoder + StaticKV."""
    import torch

    from rapid.kvcache import StaticKV
    from rapid.modeling import additive_mask

    kv = StaticKV.for_config(decoder.config, CAPACITY, torch.float32)
    out = []
    for toks, pos, allowed in steps:
        kv.begin(len(toks))
        with torch.inference_mode():
            logits = decoder(torch.as_tensor(np.asarray(toks, np.int64))[None],
                             torch.as_tensor(np.asarray(pos, np.int64))[None],
                             additive_mask(torch.as_tensor(allowed), torch.float32), kv)
        kv.commit(len(toks))
        out.append(logits[0].numpy())
    return out


def _wait(handle) -> np.ndarray:
    for _ in range(100_000):
        if handle.ready():
            break
    assert handle.ready()
    return handle.logits()


def _raw_kv(engine, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Copies of the raw cache buffers' first n slots, [layers, kv_heads, n, head_dim]."""
    if hasattr(engine, "kv_arrays"):
        k, v = engine.kv_arrays()
    else:  # TorchEngine: StaticKV
        k, v = engine.kv.k.numpy(), engine.kv.v.numpy()
    return k[:, :, :n].copy(), v[:, :, :n].copy()


def _tree_step(engine, prefix: int, seed: int = 1):
    toks = _prompt(len(PARENTS), seed)
    allowed, depth = tree_allowed(PARENTS, prefix)
    return toks, prefix + depth, allowed


# --------------------------------------------------------------------------------- tests --

def test_engine_info(engine_factory):
    e = engine_factory()
    assert isinstance(e, DraftEngine)
    assert isinstance(e.info, EngineInfo)
    assert e.info.backend == engine_factory.kind
    assert e.info.vocab_size == 259 and e.info.capacity == CAPACITY
    assert e.info.eos_token_ids == (256,)
    assert e.info.device  # e.g. "cpu" or "CPUExecutionProvider"
    assert e.kv_len == 0
    h = e.step([1, 2, 3], [0, 1, 2], causal_allowed(0, 3))
    assert _wait(h).shape == (3, 259) and h.logits().dtype == np.float32
    assert e.kv_len == 3
    e.reset()
    assert e.kv_len == 0


def test_prefill_decode_tree_match_pytorch(engine_factory, reference):
    e = engine_factory()
    prompt = _prompt(16)
    tree = _tree_step(e, 17)
    steps = [(prompt, np.arange(16), causal_allowed(0, 16)),
             ([7], [16], causal_allowed(16, 1)),
             tree]
    want = _ref_steps(reference, steps)
    for (toks, pos, allowed), ref in zip(steps, want, strict=True):
        got = _wait(e.step(toks, pos, allowed))
        np.testing.assert_allclose(got, ref, atol=ATOL, rtol=0)
    assert e.kv_len == 16 + 1 + len(PARENTS)


def test_rows_select_logits(engine_factory):
    e = engine_factory()
    prompt = _prompt(8)
    full = _wait(e.step(prompt, np.arange(8), causal_allowed(0, 8)))
    e.truncate(0)
    part = _wait(e.step(prompt, np.arange(8), causal_allowed(0, 8), rows=[7, 2]))
    assert part.shape == (2, 259)
    np.testing.assert_allclose(part, full[[7, 2]], atol=1e-5, rtol=0)


def test_truncate_restores_cache_and_logits(engine_factory):
    e = engine_factory()
    e.step(_prompt(16), np.arange(16), causal_allowed(0, 16)).logits()
    k0, v0 = _raw_kv(e, 16)
    toks, pos, allowed = _tree_step(e, 16)
    first = _wait(e.step(toks, pos, allowed))
    # expand once more below the tree (boundary save -> expand -> restore)
    e.step([9, 10], [pos[-1] + 1, pos[-1] + 2], causal_allowed(e.kv_len, 2)).logits()
    e.truncate(16)
    assert e.kv_len == 16
    k1, v1 = _raw_kv(e, 16)
    assert k0.tobytes() == k1.tobytes() and v0.tobytes() == v1.tobytes()  # bit-identical
    again = _wait(e.step(toks, pos, allowed))
    np.testing.assert_allclose(again, first, atol=1e-6, rtol=0)
    with pytest.raises(ValueError):
        e.truncate(e.kv_len + 1)


def test_compact_then_step_equals_fresh_run(engine_factory, reference):
    e = engine_factory()
    prompt = _prompt(16)
    e.step(prompt, np.arange(16), causal_allowed(0, 16)).logits()
    toks, pos, allowed = _tree_step(e, 16)
    e.step(toks, pos, allowed).logits()
    e.compact([16 + i for i in PATH], 16)  # keep the accepted path 0-1-3-5
    assert e.kv_len == 16 + len(PATH)
    nxt = _wait(e.step([42], [16 + len(PATH)], causal_allowed(16 + len(PATH), 1)))

    f = engine_factory()  # fresh run over prompt + kept path
    path_toks = toks[PATH]
    seq = np.concatenate([prompt, path_toks])
    f.step(seq, np.arange(len(seq)), causal_allowed(0, len(seq))).logits()
    fresh = _wait(f.step([42], [len(seq)], causal_allowed(len(seq), 1)))
    np.testing.assert_allclose(nxt, fresh, atol=ATOL, rtol=0)
    ref = _ref_steps(reference, [(seq, np.arange(len(seq)), causal_allowed(0, len(seq))),
                                 ([42], [len(seq)], causal_allowed(len(seq), 1))])[1]
    np.testing.assert_allclose(nxt, ref, atol=ATOL, rtol=0)


def test_compact_moves_a_kept_branch(engine_factory):
    """Remap the other branch (0-2-4) and a no-op compact; entries land at dst_start…"""
    e = engine_factory()
    e.step(_prompt(16), np.arange(16), causal_allowed(0, 16)).logits()
    toks, pos, allowed = _tree_step(e, 16)
    e.step(toks, pos, allowed).logits()
    k_before, v_before = _raw_kv(e, e.kv_len)
    src = [16, 18, 20]
    e.compact(src, 16)
    k_after, v_after = _raw_kv(e, e.kv_len)
    assert e.kv_len == 19
    np.testing.assert_array_equal(k_after[:, :, 16:19], k_before[:, :, src])
    np.testing.assert_array_equal(v_after[:, :, 16:19], v_before[:, :, src])
    np.testing.assert_array_equal(k_after[:, :, :16], k_before[:, :, :16])
    e.compact([16, 17], 16)  # already in place: only the length changes
    assert e.kv_len == 18
    k_before, v_before = _raw_kv(e, 18)
    e.compact([17, 16], 16)  # a swap: a move reads a slot an earlier move wrote (snapshot semantics)
    k_after, v_after = _raw_kv(e, 18)
    np.testing.assert_array_equal(k_after[:, :, 16:18], k_before[:, :, [17, 16]])
    np.testing.assert_array_equal(v_after[:, :, 16:18], v_before[:, :, [17, 16]])
    with pytest.raises(ValueError):
        e.compact([30], 16)


def test_context_full_is_a_rapid_error(engine_factory):
    e = engine_factory()
    e.step(_prompt(CAPACITY - 2), np.arange(CAPACITY - 2), causal_allowed(0, CAPACITY - 2)).logits()
    with pytest.raises(RapidError):
        e.step([1, 2, 3], [62, 63, 64], causal_allowed(CAPACITY - 2, 3))
    assert e.kv_len == CAPACITY - 2


def test_bad_step_inputs_are_typed_errors(engine_factory):
    """Refused before anything runs: a float or int mask (an additive mask read as booleans
    would invert every entry), float or out-of-vocab tokens, negative positions, bad rows."""
    e = engine_factory()
    e.step([1, 2], [0, 1], causal_allowed(0, 2)).logits()
    ok = causal_allowed(2, 2)
    bad = [([3, 4], [2, 3], np.where(ok, 0.0, -1e9), None), ([3, 4], [2, 3], ok.astype(np.int64), None),
           ([3.0, 4.0], [2, 3], ok, None), ([3, 4], [2.5, 3.0], ok, None), ([3, 259], [2, 3], ok, None),
           ([-1, 4], [2, 3], ok, None), ([3, 4], [-1, 3], ok, None), ([3, 4], [2, 3], ok, [2]),
           ([3, 4], [2, 3], ok, [-1]), ([[3, 4]], [2, 3], ok, None)]
    for toks, pos, mask, rows in bad:
        with pytest.raises(StepInputError):
            e.step(toks, pos, mask, rows=rows)
        assert e.kv_len == 2
    assert _wait(e.step([3, 4], [2, 3], ok, rows=[1])).shape == (1, 259)


# ----------------------------------------------------------------------------- selection --

def test_auto_selects_onnx_for_an_export_and_logs_why(tiny_export, caplog):
    from rapid.engines.select import choose_backend, open_engine

    model, export = tiny_export
    kind, why = choose_backend("auto", export)
    assert kind in ("onnx", "trt") and why
    with caplog.at_level(logging.INFO, logger="rapid.engines"):
        e = open_engine("auto", export, 32)
    assert e.info.backend == kind
    assert any("draft engine" in r.getMessage() and kind in r.getMessage() for r in caplog.records)
    assert choose_backend("auto", model)[0] == "torch"  # a model folder, not an export
    t = open_engine("torch", export, 32)  # torch from an export folder: the exported model
    assert t.info.backend == "torch" and t.info.vocab_size == 259
    with pytest.raises(RapidError):
        open_engine("tpu", export)


def test_onnx_engine_rejects_bad_options(tiny_export):
    from rapid.engines.ort_engine import OrtEngine

    with pytest.raises(RapidError, match="capacity"):
        OrtEngine(tiny_export[1], capacity=10_000)
    with pytest.raises(RapidError, match="kv_binding"):
        OrtEngine(tiny_export[1], kv_binding="nope")
    with pytest.raises(RapidError, match="not available"):
        OrtEngine(tiny_export[1], providers=["NoSuchExecutionProvider"])
    with pytest.raises(RapidError, match="manifest"):
        OrtEngine(tiny_export[0])  # a model folder is not an export folder


def test_trt_modules_import_without_tensorrt(tiny_export):
    import importlib

    for mod in ("rapid.engines.trt_engine", "rapid.engines.cuda", "rapid.export.trt_build"):
        importlib.import_module(mod)
    from rapid.core.trt_support import missing_modules
    from rapid.engines.trt_engine import TrtEngine

    missing = missing_modules()
    if not missing:
        pytest.skip("tensorrt and pycuda are installed here")
    with pytest.raises(RapidError) as err:
        TrtEngine(tiny_export[1])
    for name in missing:
        assert name in str(err.value)
    assert "Jetson" in str(err.value)
