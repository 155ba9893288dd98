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

import pytest
import torch

from rapid.engines import rowops
from rapid.server.invariance_stress import stress

pytestmark = pytest.mark.skipif(not rowops.available(), reason="librapid_rowops is not built (scripts/setup.sh)")


def test_stress_default_isa_5000_rows(stress_model):
    check = stress(stress_model, 5000, seed=0)
    assert check.invariant and check.rows >= 5000, check


@pytest.mark.parametrize("isa", list(rowops.info().available[1:]) if rowops.available() else [])
def test_stress_every_other_isa(stress_model, isa):
    default = rowops.info().isa
    rowops.select(isa)
    try:
        check = stress(stress_model, 600, seed=1 + rowops.info().available.index(isa))
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


@pytest.mark.realmodels
def test_stress_the_real_default_target():
    """The real 28-layer target in bf16: trees up to 28 nodes (its flat budget), batches of 1-3."""
    from rapid import models
    from rapid.modeling import load_decoder

    if not models.is_converted(models.ALIASES["default-target"].folder):
        pytest.skip("default target not fetched (rapid models fetch)")
    model, _ = load_decoder("default-target", torch.bfloat16)
    check = stress(model, 300, seed=2, budget=28, max_sessions=3)
    assert check.invariant and check.rows >= 300, check
