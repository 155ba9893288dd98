"""The invariance stress: random trees and batches of sessions, every row compared bitwise with
the target-alone step of its prefix (``rapid.server.invariance.step_rows``).

The suite runs it on the default target's layer shapes (tests/server/test_invariance_stress.py),
on the real target where it is fetched, and ``scripts/device_check.py`` on a GPU. Each batch
holds 1–6 sessions whose prompts sit on both sides of 32 / 64 / 128 / 256 keys and whose trees
(bushy, deep or mixed) go up to ``budget`` nodes; it is verified in one forward at 1 thread,
then each tree alone at ``threads`` threads, and both are compared with one walk of steps.
"""

from __future__ import annotations

import numpy as np
import torch

from rapid.core.sampling import SamplingParams
from rapid.modeling import Decoder
from rapid.server.chains import forward_chains
from rapid.server.invariance import NO_ROWS, RowCheck, compare_rows, step_rows
from rapid.server.target import TargetSession

BOUNDARY_PREFIXES = (1, 2, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255, 256, 257)

Tree = tuple[list[int], list[int], list[int]]  # (prompt, tokens, parents)


def random_tree(rng: np.random.Generator, vocab: int, n: int) -> tuple[list[int], list[int]]:
    """n nodes: bushy (uniform parent), deep (mostly the previous node) or a mix."""
    style = rng.integers(0, 3)
    parents = []
    for j in range(n):
        deep = style == 1 or (style == 2 and rng.random() < 0.5)
        parents.append(j - 1 if deep else int(rng.integers(-1, j)))
    return [int(t) for t in rng.integers(0, vocab, n)], parents


def random_batch(rng: np.random.Generator, vocab: int, budget: int, max_sessions: int = 6) -> list[Tree]:
    batch = []
    for _ in range(int(rng.integers(1, max_sessions + 1))):
        p = int(rng.choice(BOUNDARY_PREFIXES)) if rng.random() < 0.7 else int(rng.integers(1, 300))
        n = int(rng.integers(0, budget + 1)) if rng.random() < 0.5 else int(rng.integers(0, min(budget, 15) + 1))
        batch.append(([int(t) for t in rng.integers(0, vocab, p)], *random_tree(rng, vocab, n)))
    return batch


def check_batch(model: Decoder, batch: list[Tree], budget: int, threads: int) -> RowCheck:
    """One batch: together at 1 thread, each alone at ``threads``, against target-alone steps."""
    before = torch.get_num_threads()
    sessions = [TargetSession(model, p, SamplingParams(), capacity=len(p) + budget + 4, max_nodes=max(budget, 1))
                for p, _, _ in batch]
    check = NO_ROWS
    try:
        torch.set_num_threads(1)
        want = [step_rows(s, t, par) for s, (_, t, par) in zip(sessions, batch, strict=True)]
        jobs = [s.chain_job(t, par) for s, (_, t, par) in zip(sessions, batch, strict=True)]
        together = forward_chains(model, jobs)
        torch.set_num_threads(threads)
        for s, (_, t, par), w, r in zip(sessions, batch, want, together, strict=True):
            check = check.merge(compare_rows(s.logits(r), w))
            check = check.merge(compare_rows(s.logits(s.forward_tree(t, par)), w))
    finally:
        torch.set_num_threads(before)
    return check


def stress(model: Decoder, rows: int, seed: int = 0, budget: int = 64, threads: int = 2,
           max_sessions: int = 6) -> RowCheck:
    """Random batches until at least ``rows`` rows were compared."""
    rng = np.random.default_rng(seed)
    total = NO_ROWS
    while total.rows < rows:
        total = total.merge(check_batch(model, random_batch(rng, model.config.vocab_size, budget, max_sessions),
                                        budget, threads))
    return total
