"""The PyTorch draft's projections on the row kernels: every ``nn.Linear`` replaced, the same
draft within float32 rounding, and ``open_engine`` choosing them where they are built."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from rapid.engines import rowops
from rapid.engines.row_linear import RowLinear, use_row_linears
from rapid.engines.select import EngineSelectError, _wants_row_linears, open_engine

pytestmark = pytest.mark.skipif(not rowops.available(), reason="librapid_rowops not built (scripts/setup.sh)")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from rapid.tiny import build_tiny

    return build_tiny(tmp_path_factory.mktemp("rowlin") / "model", "qwen2", seed=3)


def _tree_step(engine, prompt: list[int]) -> np.ndarray:
    """Prefill ``prompt``, then one step of a 5-node tree (root children 0, 1; 2 under 0; 3, 4
    under 2); its logits."""
    n = len(prompt)
    engine.step(prompt, list(range(n)), np.tril(np.ones((n, n), dtype=bool))).logits()
    parents = [-1, -1, 0, 2, 2]
    allowed = np.zeros((5, n + 5), dtype=bool)
    allowed[:, :n] = True
    for i in range(5):
        j = i
        while j >= 0:
            allowed[i, n + j] = True
            j = parents[j]
    depth = [1, 1, 2, 3, 3]
    return np.asarray(engine.step([5, 9, 11, 3, 4], [n - 1 + d for d in depth], allowed).logits())


def test_every_projection_is_replaced_and_the_draft_is_the_same(tiny_model):
    plain = open_engine("torch", str(tiny_model), capacity=64, dtype="float32", row_linears=False)
    rows = open_engine("torch", str(tiny_model), capacity=64, dtype="float32", row_linears=True)
    layers = plain.model.config.num_layers
    assert not any(isinstance(m, nn.Linear) for m in rows.model.modules())
    assert sum(isinstance(m, RowLinear) for m in rows.model.modules()) == 7 * layers + 1
    prompt = list(range(20, 60))
    a, b = _tree_step(plain, prompt), _tree_step(rows, prompt)
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-4)  # float32, another summation order
    assert (a.argmax(-1) == b.argmax(-1)).all()


def test_a_row_linear_is_the_linear_it_replaces():
    torch.manual_seed(0)
    lin = nn.Linear(96, 40, bias=True)
    x = torch.randn(3, 7, 96)
    model = nn.Sequential(lin)
    expect = lin(x)
    assert use_row_linears(model) == 1
    got = model(x)
    assert got.shape == expect.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, expect, rtol=0, atol=1e-5)
    # a bf16 input comes back bf16 (computed in float32)
    assert model(x.bfloat16()).dtype == torch.bfloat16


def test_the_default_follows_the_kernels_and_an_explicit_request_needs_them():
    assert _wants_row_linears(None, built=True, bf16=False)
    assert not _wants_row_linears(None, built=False, bf16=False)
    assert not _wants_row_linears(False, built=True, bf16=False)
    with pytest.raises(EngineSelectError):
        _wants_row_linears(True, built=False, bf16=False)
