"""Stress: every tree row, in every batch, at 1 and 2 threads, on every ISA this CPU runs, is
bitwise the target-alone step of its prefix (``rapid.server.row_forward``).

The model has the default target's layer shapes (hidden 1536, 12 heads / 2 KV heads of 128,
MLP 8960; 2 of its 28 layers, a 4096-token vocabulary so that a step costs milliseconds; the
real LM head's shape is covered in test_rowops.py). Trees are random up to the server's largest
budget (64 nodes), prompts sit on both sides of 32 / 64 / 128 / 256 keys, batches hold 1–6
sessions (often past 32 unique rows). The default ISA compares ≥ 5,000 rows per run; every
other ISA the CPU runs (how other machine classes compute) ≥ 600.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rapid.modeling import Decoder
from rapid.sampling import SamplingParams
from rapid.server import rowops
from rapid.server.chains import forward_chains
from rapid.server.invariance import NO_ROWS, RowCheck, compare_rows, step_rows
from rapid.server.target import TargetSession

BUDGET = 64  # the server's default --max-nodes
BOUNDARY_PREFIXES = (1, 2, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257)
VOCAB = 4096  # the stress_model fixture's (tests/server/conftest.py)

pytestmark = pytest.mark.skipif(not rowops.available(), reason="librapid_rowops is not built (scripts/setup.sh)")


def random_tree(rng: np.random.Generator, n: int) -> tuple[list[int], list[int]]:
    """n nodes: bushy (uniform parent), deep (mostly the previous node) or a mix."""
    style = rng.integers(0, 3)
    parents = []
    for j in range(n):
        deep = style == 1 or (style == 2 and rng.random() < 0.5)
        parents.append(j - 1 if deep else int(rng.integers(-1, j)))
    return [int(t) for t in rng.integers(0, VOCAB, n)], parents


def random_batch(rng: np.random.Generator) -> list[tuple[list[int], list[int], list[int]]]:
    batch = []
    for _ in range(int(rng.integers(1, 7))):
        p = int(rng.choice(BOUNDARY_PREFIXES)) if rng.random() < 0.7 else int(rng.integers(1, 300))
        n = int(rng.integers(0, BUDGET + 1)) if rng.random() < 0.5 else int(rng.integers(0, 16))
        batch.append(([int(t) for t in rng.integers(0, VOCAB, p)], *random_tree(rng, n)))
    return batch


def stress(model: Decoder, rows: int, seed: int) -> RowCheck:
    """Random batches until ``rows`` rows were compared: each batch in one forward at 1 thread,
    then each session's tree alone at 2 threads, against one walk of target-alone steps."""
    rng = np.random.default_rng(seed)
    total, before = NO_ROWS, torch.get_num_threads()
    try:
        while total.rows < rows:
            batch = random_batch(rng)
            sessions = [TargetSession(model, p, SamplingParams(), capacity=len(p) + BUDGET + 4, max_nodes=BUDGET)
                        for p, _, _ in batch]
            torch.set_num_threads(1)
            want = [step_rows(s, t, par) for s, (_, t, par) in zip(sessions, batch, strict=True)]
            together = forward_chains(model, [s.chain_job(t, par) for s, (_, t, par) in zip(sessions, batch,
                                                                                           strict=True)], 1)
            torch.set_num_threads(2)
            for s, (_, t, par), w, r in zip(sessions, batch, want, together, strict=True):
                total = total.merge(compare_rows(s.logits(r), w))
                total = total.merge(compare_rows(s.logits(s.forward_tree(t, par)), w))
    finally:
        torch.set_num_threads(before)
    return total


def test_stress_default_isa_5000_rows(stress_model):
    check = stress(stress_model, 5000, seed=0)
    assert check.invariant and check.rows >= 5000, check


@pytest.mark.parametrize("isa", list(rowops.info().available[1:]) if rowops.available() else [])
def test_stress_every_other_isa(stress_model, isa):
    default = rowops.info().isa
    rowops.select(isa)
    try:
        check = stress(stress_model, 600, seed=hash(isa) % 1000)
    finally:
        rowops.select(default)
    assert check.invariant and check.rows >= 600, (isa, check)


def test_the_stress_catches_a_row_count_dependent_kernel(stress_model, monkeypatch):
    """Mutation check: a linear whose rows depend on M (torch's bf16 GEMM from 2 rows) must fail."""
    exact = rowops.linear

    def m_dependent(x, w, b=None, threads=1):
        if x.shape[0] == 1:
            return exact(x, w, b, threads)
        return exact(x * (1 + 1e-3 * (x.shape[0] % 3)), w, b, threads)  # rows that depend on M

    monkeypatch.setattr(rowops, "linear", m_dependent)
    check = stress(stress_model, 50, seed=5)
    assert check.differing > 0, check
