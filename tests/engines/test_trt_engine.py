"""TensorRT backend specifics over the emulated tensorrt/pycuda (``trt_emulation``): refused
bindings, 256-byte alignment at every (P, T), one shared scratch, the memory plan as allocated,
chunked prefill and the fp16 data path. The conformance suite runs the protocol itself."""

from __future__ import annotations

import numpy as np
import pytest
from trt_emulation import install_trt_emulation
from trt_emulation_engine import USER_MANAGED

from rapid.core.geometry import causal_allowed
from rapid.core.trt_support import PREFILL_CHUNK
from rapid.engines.base import StepInputError
from rapid.engines.ort_engine import OrtEngine
from rapid.engines.trt_engine import TrtEngine
from rapid.engines.trt_io import TrtTensorError
from rapid.export.parity import tree_allowed

CAP = 64


@pytest.fixture
def emulated(monkeypatch, tmp_path, tiny_export):
    return install_trt_emulation(monkeypatch, tiny_export[1], tmp_path)


def _prompt(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, n)


@pytest.mark.parametrize("what,tensor", [("address", "present_value_1"), ("address", "logits"),
                                         ("address", "past_key_1"), ("shape", "past_value_1"),
                                         ("shape", "attn_mask")])
def test_a_refused_binding_names_its_tensor(emulated, what, tensor):
    e = TrtEngine(emulated.folder, CAP)
    e.step(_prompt(3), np.arange(3), causal_allowed(0, 3)).logits()
    getattr(emulated.trt, f"refuse_{what}").add(tensor)
    with pytest.raises(TrtTensorError) as err:
        e.step([5], [3], causal_allowed(3, 1))
    assert (err.value.tensor, err.value.what) == (tensor, what)
    assert len(emulated.trt.executions) == 1  # nothing ran with a stale binding


def test_an_engine_dtype_unlike_the_manifest_is_refused(emulated):
    emulated.trt.dtype_override["input_ids"] = np.int32  # e.g. an engine that narrowed int64 ids
    with pytest.raises(TrtTensorError) as err:
        TrtEngine(emulated.folder, CAP)
    assert (err.value.tensor, err.value.what) == ("input_ids", "dtype")


def test_bindings_are_aligned_at_every_past_and_step_length(emulated):
    """T = 1…5 at every P from 0 to 40 (odd and even): the emulation refuses any address that is
    not 256-byte aligned and checks every binding lies inside an allocation, overlapping nothing."""
    e = TrtEngine(emulated.folder, CAP)
    p, t = 0, 1
    while p + t <= 40:
        e.step(_prompt(t, p), np.arange(p, p + t), causal_allowed(p, t)).logits()
        p, t = p + t, t % 5 + 1
    got = {(tt, pp) for _, tt, pp in emulated.trt.executions}
    assert {1, 2, 3, 4, 5} <= {tt for tt, _ in got} and len({pp % 4 for _, pp in got}) == 4


def test_contexts_share_one_scratch_and_memory_is_the_plan(emulated):
    e = TrtEngine(emulated.folder, CAP)
    ctxs = emulated.trt.contexts
    assert len(ctxs) == 2 and {c.strategy for c in ctxs} == {USER_MANAGED}
    assert len({c.scratch for c in ctxs}) == 1  # one (pointer, size) for both profiles
    scratch = ctxs[0].scratch[1]
    assert emulated.memory.device_bytes() == e.plan.device + scratch
    assert emulated.memory.pinned == e.plan.pinned
    assert e.chunk == min(PREFILL_CHUNK, CAP) and e.rows_cap == 32  # the tree profile's max T
    e.close()
    assert emulated.memory.device_bytes() == 0


def test_long_prefill_runs_in_chunks_with_the_same_logits(emulated, tiny_export):
    """A 60-token prefill at chunk 48 runs as 48 tokens on the prefill profile, then 12 on the
    tree profile; all 60 rows come back (more than rows_cap = 32, so in groups) in request order
    and equal ONNX Runtime's single run."""
    e = TrtEngine(emulated.folder, CAP, chunk=48)
    assert (e.chunk, e.rows_cap) == (48, 32)
    rows = [59, 0, 1, 2, 40, 17, 18]
    got = e.step(_prompt(60), np.arange(60), causal_allowed(0, 60)).logits()
    assert emulated.trt.executions == [(0, 48, 0), (1, 12, 48)]  # (profile, T, P)
    ref = OrtEngine(tiny_export[1], CAP).step(_prompt(60), np.arange(60), causal_allowed(0, 60)).logits()
    np.testing.assert_allclose(got, ref, atol=1e-5, rtol=0)
    e.truncate(0)
    part = e.step(_prompt(60), np.arange(60), causal_allowed(0, 60), rows=rows).logits()
    np.testing.assert_array_equal(part, got[rows])
    e.truncate(10)
    with pytest.raises(StepInputError):  # 50 > chunk tokens attending to later ones: not chunkable
        e.step(_prompt(50), np.arange(10, 60), np.ones((50, 60), bool))
    assert e.kv_len == 10


def test_fp16_engine_equals_onnx_runtime_bit_for_bit(monkeypatch, tmp_path, tiny_export_fp16):
    """The fp16 data path (itemsize 2, padded per-layer blocks, the fp16 mask fill): TrtEngine
    over the emulation feeds ONNX Runtime exactly what OrtEngine does, so the logits are equal."""
    emu = install_trt_emulation(monkeypatch, tiny_export_fp16, tmp_path)
    e, o = TrtEngine(emu.folder, CAP), OrtEngine(tiny_export_fp16, CAP)
    assert e.dtype == np.float16
    tree, depth = tree_allowed([-1, 0, 0, 1, 2, 3], 18)
    steps = [(_prompt(17), np.arange(17), causal_allowed(0, 17)), ([7], [17], causal_allowed(17, 1)),
             (_prompt(6, 1), 18 + depth, tree)]
    for toks, pos, allowed in steps:
        np.testing.assert_array_equal(e.step(toks, pos, allowed).logits(), o.step(toks, pos, allowed).logits())
    ek, ev = e.kv_arrays()
    np.testing.assert_array_equal(ek[:, :, :24], o.kv_arrays()[0][:, :, :24])
    np.testing.assert_array_equal(ev[:, :, :24], o.kv_arrays()[1][:, :, :24])

