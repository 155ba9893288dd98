"""The fixed-shape library forward (rapid.server.block_forward: a CUDA target, float64, a CPU
without the row kernels): the call plan, every row bitwise its one-token step (property tests
on tiny bf16 / float64 models, a stress on the default target's layer shapes in bf16 and fp32),
and the start-up position probe, including that it catches a kernel whose rows depend on their
position in a block."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM
from tree_strategies import trees

from rapid.kvcache import StaticKV
from rapid.modeling import Decoder
from rapid.server import block_forward
from rapid.server.block_forward import KEY_BLOCK, OTHER_SHAPE, BlockShape, RowChain, key_slots, plan
from rapid.server.invariance import check_invariance, compare_batch, compare_tree, position_probe
from rapid.server.invariance_stress import stress


@pytest.fixture(autouse=True)
def library_path(monkeypatch):
    """The forward a CUDA or float64 target runs, also for float32 / bf16 CPU models here."""
    monkeypatch.setenv("RAPID_ROW_KERNELS", "0")


@pytest.fixture(scope="module")
def bf16_tiny(tiny_dir):
    path = tiny_dir("target32", seed=0)
    return Decoder.from_hf(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)).to(torch.bfloat16)


def _kv(length: int) -> StaticKV:
    kv = StaticKV(1, 1, 2, length + 300)
    kv.length = length
    return kv


def test_key_slots():
    assert [key_slots(n) for n in (1, 255, 256, 257, 512, 513)] == [256, 256, 256, 512, 512, 768]


def test_a_prefill_is_cut_at_key_slot_boundaries_and_every_segment_length():
    """A chain of 20 rows over 250 prefix keys: rows with 251..256 keys, then 257..270 (cut at
    256), each run in segments of at most L rows; each row's key count is its own."""
    shape = BlockShape(rows=8, segment=4, segments=2)
    p = plan([RowChain(_kv(250), list(range(20)))], 20, shape, group=1, device=torch.device("cpu"))
    segments = [(b, j) for b in p.blocks for j in range(b.rows.shape[0]) if b.rows[j, 0] < 20]
    rows = [[r for r in b.rows[j].tolist() if r < 20] for b, j in segments]
    assert rows == [[0, 1, 2, 3], [4, 5], [6, 7, 8, 9], [10, 11, 12, 13], [14, 15, 16, 17], [18, 19]]
    assert [b.keys.shape[1] for b, _ in segments] == [256, 256, 512, 512, 512, 512]
    for (b, j), seg in zip(segments, rows, strict=True):
        counts = b.allowed[j, 0].sum(-1).tolist()[:len(seg)]
        assert counts == [250 + r + 1 for r in seg]  # its prefix, its ancestors, itself
        assert b.keys[j, :counts[-1]].tolist() == list(range(250)) + [250 + r for r in range(seg[-1] + 1)]


def test_every_row_of_a_bushy_batch_is_in_exactly_one_position():
    shape = OTHER_SHAPE
    a, b = _kv(3), _kv(100)
    chains = [RowChain(a, [0, 1]), RowChain(b, [2, 3, 5]), RowChain(b, [2, 4]), RowChain(b, [2, 3, 6])]
    p = plan(chains, 7, shape, group=2, device=torch.device("cpu"))
    placed = [r for blk in p.blocks for r in blk.rows.flatten().tolist() if r < 7]
    assert sorted(placed) == list(range(7))
    assert p.prefixes == [a, b] and all(blk.rows.shape == (shape.segments, shape.segment) for blk in p.blocks)
    assert all(blk.allowed.shape[2] == shape.segment * 2 for blk in p.blocks)  # L·G query rows


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prompt=st.lists(st.integers(0, 258), min_size=1, max_size=300), tree=trees(),
       dtype=st.sampled_from(["bf16", "float64"]))
def test_every_tree_row_is_a_one_token_step(bf16_tiny, tiny_pair, prompt, tree, dtype):
    model = bf16_tiny if dtype == "bf16" else tiny_pair[0]
    check = compare_tree(model, prompt, *tree)
    assert check.invariant, check


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(st.tuples(st.lists(st.integers(0, 258), min_size=1, max_size=280), trees(10)),
                      min_size=2, max_size=6))
def test_batched_sessions_keep_every_row(bf16_tiny, batch):
    check = compare_batch(bf16_tiny, [(p, t, par) for p, (t, par) in batch])
    assert check.invariant, check


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_stress_the_default_target_layer_shapes(stress_model, dtype):
    """Random trees to 40 nodes, batches of 1-6 sessions, prompts across 256 keys; 1 thread (the
    library path promises one thread count per process, not across them)."""
    model = stress_model if dtype == torch.bfloat16 else copy.deepcopy(stress_model).float()
    rows = 100 if dtype == torch.bfloat16 else 60
    check = stress(model, rows, seed=3, budget=40, threads=1)
    assert check.invariant and check.rows >= rows, check


def test_the_position_probe_covers_every_key_slot_count_and_position(bf16_tiny):
    check = position_probe(bf16_tiny, 600)
    shape = OTHER_SHAPE
    per_slots = shape.segment * max(shape.segments, shape.rows // shape.segment)
    assert check.invariant and check.rows == per_slots * key_slots(600) // KEY_BLOCK, check


def test_the_position_probe_catches_a_position_dependent_kernel(bf16_tiny, monkeypatch):
    """Mutation check: per-row calls whose rows drift with their position in the block."""
    exact = block_forward._qkv

    def drifting(layer, x, cos, sin):
        q, k, v = exact(layer, x, cos, sin)
        return q * (1 + 1e-2 * torch.arange(x.shape[0], dtype=q.dtype)[:, None, None]), k, v

    monkeypatch.setattr(block_forward, "_qkv", drifting)
    assert position_probe(bf16_tiny, 300).differing > 0


def test_serve_reads_the_library_path_as_checked_not_constructed(bf16_tiny):
    found = check_invariance(bf16_tiny, 300)
    assert found.check.invariant and found.measured
    assert "every block position and key-slot count checked" in found.line()


def test_the_forward_changes_no_session_and_matches_per_session_forwards(tiny_pair):
    """One batched forward = each session's own forward (rows and new KV), bitwise."""
    from rapid.core.sampling import SamplingParams
    from rapid.server.chains import forward_chains
    from rapid.server.target import TargetSession

    target, _ = tiny_pair
    rng = np.random.default_rng(4)
    sessions = [TargetSession(target, [int(x) for x in rng.integers(0, 250, n)], SamplingParams()) for n in (3, 260)]
    trees = [([5, 6, 7], [-1, 0, 0]), ([8], [-1])]
    before = [s.kv.k.clone() for s in sessions]
    together = forward_chains(target, [s.chain_job(*t) for s, t in zip(sessions, trees, strict=True)])
    for s, t, r, k in zip(sessions, trees, together, before, strict=True):
        alone = forward_chains(target, [s.chain_job(*t)])[0]
        assert torch.equal(r.logits, alone.logits) and torch.equal(s.kv.k, k)
        rows = slice(r.offset, r.offset + len(t[0]) + 1)
        assert all(torch.equal(a[0][:, rows], b[0]) for a, b in zip(r.kv.new_k, alone.kv.new_k, strict=True))
