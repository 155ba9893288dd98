"""``share_engine``: N engines over one copy of the weights (``rapid edge --parallel N``), each
with its own KV — interleaved steps give exactly what each engine gives alone."""

from __future__ import annotations

import numpy as np
import pytest

from rapid.engines.select import open_engine, share_engine


@pytest.fixture(scope="module")
def export_dir(tmp_path_factory):
    from rapid.export.onnx_export import export_onnx
    from rapid.tiny import build_tiny

    root = tmp_path_factory.mktemp("share")
    model = build_tiny(root / "model", "qwen2", seed=5)
    export_onnx(str(model), root / "export", max_context=128, max_tree=16, progress=False)
    return model, root / "export"


def _steps(engine, prompt):
    """Prefill ``prompt``, then one step of two tokens; the last rows' logits."""
    n = len(prompt)
    causal = np.tril(np.ones((n, n), dtype=bool))
    a = engine.step(prompt, list(range(n)), causal).logits()[-1]
    allowed = np.ones((2, n + 2), dtype=bool)
    allowed[0, n + 1] = False
    b = engine.step([7, 8], [n, n + 1], allowed).logits()
    return np.asarray(a), np.asarray(b)


@pytest.mark.parametrize("backend", ["torch", "onnx"])
def test_shared_engines_have_one_model_and_their_own_kv(export_dir, backend):
    model, export = export_dir
    if backend == "torch":
        first = open_engine("torch", str(model), capacity=64, dtype="float32")
    else:
        first = open_engine("onnx", str(export), capacity=64)
    second = share_engine(first)
    if backend == "torch":
        assert second.model is first.model and second.kv is not first.kv
    else:
        assert second.session is first.session and second.k is not first.k
    p1, p2 = [1, 2, 3, 4, 5], [9, 8, 7]
    n1 = len(p1)
    causal = np.tril(np.ones((n1, n1), dtype=bool))
    x = first.step(p1, list(range(n1)), causal).logits()[-1]  # interleave: first, second, first
    y_alone = _steps(share_engine(first), p2)
    y = _steps(second, p2)
    allowed = np.ones((2, n1 + 2), dtype=bool)
    allowed[0, n1 + 1] = False
    x2 = first.step([7, 8], [n1, n1 + 1], allowed).logits()
    x_alone = _steps(share_engine(first), p1)
    assert np.array_equal(np.asarray(x), x_alone[0]) and np.array_equal(np.asarray(x2), x_alone[1])
    assert np.array_equal(y[0], y_alone[0]) and np.array_equal(y[1], y_alone[1])
    assert first.kv_len == n1 + 2 and second.kv_len == len(p2) + 2
