"""The row-invariant CPU forward (rapid.server.row_forward): a prefill of a sequence leaves the
same KV bits as stepping through it (a re-prefilled session resumes exactly), a served target
can drop its unpacked weights, and every float32/bf16 CPU target runs on it."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from rapid.core.acceptance import Verdict
from rapid.core.sampling import SamplingParams
from rapid.engines import rowops
from rapid.modeling import Decoder
from rapid.server import row_forward
from rapid.server.target import TargetSession, reference_decode

pytestmark = pytest.mark.skipif(not rowops.available(), reason="librapid_rowops is not built (scripts/setup.sh)")


@pytest.fixture(scope="module", params=[torch.float32, torch.bfloat16])
def cpu_target(tiny_dir, request):
    path = tiny_dir("target32", seed=0)
    return Decoder.from_hf(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)).to(request.param)


def test_float32_and_bf16_cpu_targets_run_on_the_row_kernels(cpu_target, tiny_pair, monkeypatch):
    assert row_forward.enabled(cpu_target)
    assert not row_forward.enabled(tiny_pair[0])  # float64: the torch forward
    monkeypatch.setenv("RAPID_ROW_KERNELS", "0")
    assert not row_forward.enabled(cpu_target)


def test_a_prefill_leaves_the_kv_a_step_by_step_session_has(cpu_target):
    """What a resumed-by-prefill session relies on: prompt + committed tokens prefilled in one
    forward give bitwise the KV and the next logits of the session that stepped through them."""
    rng = np.random.default_rng(0)
    prompt = [int(t) for t in rng.integers(0, 259, 40)]
    forced = [int(t) for t in rng.integers(0, 259, 12)]
    stepped = TargetSession(cpu_target, prompt, SamplingParams(), capacity=80)
    for t in forced:
        stepped.commit(stepped.forward_tree([], []), Verdict((), t), [])
    again = TargetSession(cpu_target, prompt + forced, SamplingParams(), capacity=80)
    n = stepped.kv.length
    assert n == again.kv.length
    assert torch.equal(stepped.kv.k[:, :, :n], again.kv.k[:, :, :n])
    assert torch.equal(stepped.kv.v[:, :, :n], again.kv.v[:, :, :n])
    assert np.array_equal(stepped.logits(stepped.forward_tree([], [])), again.logits(again.forward_tree([], [])))


def test_release_unpacked_keeps_the_output_and_frees_the_copies(cpu_target, monkeypatch):
    model = copy.deepcopy(cpu_target)
    before = reference_decode(model, [5, 6, 7, 8], 16, SamplingParams())
    freed = row_forward.release_unpacked(model)
    projections = sum(m.in_features * m.out_features for m in cpu_target.modules() if isinstance(m, torch.nn.Linear)
                      and m.weight is not cpu_target.embed_tokens.weight)
    assert freed == projections * cpu_target.dtype.itemsize
    assert model.layers[0].mlp.up_proj.weight.numel() == 0
    monkeypatch.setenv("RAPID_ROW_KERNELS", "0")  # no torch forward left to fall back to
    assert row_forward.enabled(model)
    assert reference_decode(model, [5, 6, 7, 8], 16, SamplingParams()) == before
    other = next((i for i in rowops.info().available if i != rowops.info().isa), None)
    if other:
        default = rowops.info().isa
        rowops.select(other)
        try:
            with pytest.raises(rowops.RowOpsArgumentError, match="released"):
                reference_decode(model, [5, 6, 7, 8], 2, SamplingParams())
        finally:
            rowops.select(default)


def test_a_model_converted_to_another_dtype_is_packed_again(tiny_dir):
    path = tiny_dir("target32", seed=0)
    model = Decoder.from_hf(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)).to(torch.bfloat16)
    assert row_forward.row_weights(model).layers[0].q.code == 1
    model = model.float()
    assert row_forward.row_weights(model).layers[0].q.code == 0
    fp32 = Decoder.from_hf(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)).to(torch.bfloat16).float()
    assert reference_decode(model, [5, 6, 7, 8], 12, SamplingParams()) == reference_decode(fp32, [5, 6, 7, 8], 12,
                                                                                          SamplingParams())
