"""The send cut: n* = argmax (1 + g·Σ exp(s_i)) / (fixed + V(n)) over the best-first prefix."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from rapid.engines.torch_engine import TorchEngine
from rapid.runtime.drafter import Drafter
from rapid.runtime.tree import TokenTree, TreeParams
from rapid.runtime.tree_cut import G_MAX, G_MIN, TreeCut, best_cut


def _rate(scores, n, verify, fixed, gain=1.0):
    return (1 + gain * sum(math.exp(s) for s in scores[:n])) / (fixed + verify(n))


def test_a_flat_curve_sends_every_node_and_a_steep_one_the_best():
    scores = [math.log(p) for p in (0.9, 0.6, 0.3, 0.1, 0.05)]
    assert best_cut(scores, lambda n: 0.3, 0.1) == 5
    assert best_cut(scores, lambda n: 0.3 * n, 0.1) == 1


def test_a_node_is_sent_while_its_tokens_pay_for_its_rows():
    # V(n) = 0.3 + 0.03 (n - 1), fixed 0.1: rows cost 7.5 % of a round each; node i gives p_i tokens
    scores = [math.log(p) for p in (0.9, 0.8, 0.5, 0.2, 0.1, 0.02)]
    verify = lambda n: 0.3 + 0.03 * (n - 1)  # noqa: E731
    n = best_cut(scores, verify, 0.1)
    # rates 1.9/0.40 = 4.75, 2.7/0.43 = 6.28, 3.2/0.46 = 6.96, 3.4/0.49 = 6.94: the fourth node's
    # 0.2 tokens for 0.03 s (6.7 tokens/s) are worth less than the round's rate without it
    assert n == 3
    assert all(_rate(scores, n, verify, 0.1) >= _rate(scores, m, verify, 0.1) for m in range(1, 7))


@given(st.lists(st.floats(-8, 0), min_size=1, max_size=40), st.floats(0, 2), st.floats(0.001, 0.2),
       st.floats(0, 0.1), st.floats(G_MIN, G_MAX))
def test_the_cut_maximises_the_rate(raw, fixed, v1, slope, gain):
    scores = sorted(raw, reverse=True)
    verify = lambda n: v1 + slope * n * n  # noqa: E731
    n = best_cut(scores, verify, fixed, gain)
    best = max(_rate(scores, m, verify, fixed, gain) for m in range(1, len(scores) + 1))
    assert 1 <= n <= len(scores) and _rate(scores, n, verify, fixed, gain) == best
    assert all(_rate(scores, m, verify, fixed, gain) < best for m in range(1, n))  # ties: the smaller n


def test_no_curve_sends_everything_and_the_calibration_follows_the_verdicts():
    cut = TreeCut()
    scores = [math.log(p) for p in (0.9, 0.5, 0.4, 0.3)]
    assert cut.nodes(scores, 0.05) == 4  # no curve yet
    cut.observe_cloud([1, 2, 4], [0.1, 0.2, 0.4])  # every node doubles the round
    assert cut.nodes(scores, 0.0) == 1
    assert cut.gain == 1.0
    for _ in range(30):  # the draft promised 2.1 tokens, the target took none
        cut.observe_verdict(scores, 0.4, 0.01, 0)
    assert cut.gain == G_MIN
    for _ in range(60):
        cut.observe_verdict(scores[:1], 0.1, 0.01, 1)  # promised 0.9, took 1
    assert 1.0 < cut.gain < 1.2


def test_the_drafters_cut_keeps_the_best_nodes_closed_under_ancestors(tiny_pair):
    _, drafts = tiny_pair
    d = Drafter(TorchEngine(drafts["partial"], capacity=256), TreeParams(4, 16, 3, 3, lookup=0), ())
    d.start(list(b"a cut tree"))
    d.prefill()
    d.draft(3)
    before = TokenTree(list(d.tree.tokens), list(d.tree.parents), list(d.tree.depth), list(d.tree.score))
    assert len(before) > 5
    d.cut(5)
    tokens, parents = d.wire_tree()
    assert len(tokens) == 5 and all(p < i for i, p in enumerate(parents))
    assert sorted(d.tree.score, reverse=True) == sorted(before.score, reverse=True)[:5]
