"""The send cut: n* = argmax (1 + g·Σ exp(s_i)) / (fixed + V(n)) over the best-first prefix."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rapid.engines.torch_engine import TorchEngine
from rapid.runtime.cost_caac import CostAwareCAAC
from rapid.runtime.drafter import Drafter
from rapid.runtime.tree import TokenTree, TreeParams
from rapid.runtime.tree_cut import G_MAX, G_MIN, TreeCut, best_cut


def _rate(scores, n, verify, fixed, gain=1.0):
    gains = [gain] * len(scores) if isinstance(gain, float) else gain
    return (1 + sum(g * math.exp(s) for s, g in zip(scores[:n], gains[:n], strict=True))) / (fixed + verify(n))


def _drafted(tiny_pair, params, prompt, levels):
    """A drafter of the partial tiny draft, prefilled on ``prompt``, with ``levels`` drafted."""
    d = Drafter(TorchEngine(tiny_pair[1]["partial"], capacity=256), params, ())
    d.start(list(prompt))
    d.prefill()
    d.draft(levels)
    return d


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


@given(st.lists(st.tuples(st.floats(-8, 0), st.floats(G_MIN, G_MAX)), min_size=1, max_size=40), st.floats(0, 2),
       st.floats(0.001, 0.2), st.floats(0, 0.1), st.floats(G_MIN, G_MAX), st.booleans())
def test_the_cut_maximises_the_rate(raw, fixed, v1, slope, one_gain, per_node):
    """One calibration for every node, or one per node (draft and lookup nodes apart)."""
    raw.sort(key=lambda x: -x[0])
    scores = [s for s, _ in raw]
    gain = [g for _, g in raw] if per_node else one_gain
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
    assert cut.draft.gain == 1.0
    for _ in range(30):  # the draft promised 2.1 tokens, the target took none
        cut.observe_verdict(scores, [False] * 4, 0.4, 0.01, [])
    assert cut.draft.gain == G_MIN
    for _ in range(60):
        cut.observe_verdict(scores[:1], [False], 0.1, 0.01, [0])  # promised 0.9, took 1
    assert 1.0 < cut.draft.gain < 1.2


def test_the_drafters_cut_keeps_the_best_nodes_closed_under_ancestors(tiny_pair):
    d = _drafted(tiny_pair, TreeParams(4, 16, 3, 3, lookup=0), b"a cut tree", 3)
    before = TokenTree(list(d.tree.tokens), list(d.tree.parents), list(d.tree.depth), list(d.tree.score))
    assert len(before) > 5
    d.cut(5)
    tokens, parents = d.wire_tree()
    assert len(tokens) == 5 and all(p < i for i, p in enumerate(parents))
    assert sorted(d.tree.score, reverse=True) == sorted(before.score, reverse=True)[:5]


def test_lookup_nodes_keep_their_own_calibration():
    """The draft over-promises (g -> G_MIN) while the lookup chains under-promise: each class
    keeps its own g, so the lookup's nodes are not discounted by the draft's correction."""
    cut = TreeCut()
    cut.observe_cloud([1, 2, 4, 8], [0.1, 0.13, 0.19, 0.31])  # each row ~0.03 s
    scores = [math.log(p) for p in (0.9, 0.5, 0.5, 0.25)]
    lookup = [False, True, False, True]
    for _ in range(60):  # the draft promised 1.4 tokens and got none; the lookup 0.75 and got 2
        cut.observe_verdict(scores, lookup, 0.19, 0.01, [1, 3])
    assert cut.draft.gain == G_MIN
    assert cut.lookup.gain == pytest.approx(2 / 0.75, rel=1e-6)
    with_flags, without = cut.nodes(scores, 0.05, lookup), cut.nodes(scores, 0.05)
    assert with_flags > without  # the lookup nodes pay for their rows, discounted they would not
    gains = [G_MIN, cut.lookup.gain, G_MIN, cut.lookup.gain]  # in score order (stable on the tie)
    assert with_flags == best_cut(scores, lambda n: cut.costs.verify.predict(n), 0.05 + cut.costs.link.rtt, gains)


def test_a_verdict_without_lookup_nodes_leaves_the_lookup_calibration():
    cut = TreeCut()
    cut.observe_verdict([math.log(0.5)], [True], 0.1, 0.01, [0])  # lookup: promised 0.5, took 1
    for _ in range(20):
        cut.observe_verdict([math.log(0.9)], [False], 0.1, 0.01, [])  # draft only, rejected
    assert cut.lookup.gain == pytest.approx(2.0) and cut.draft.gain == G_MIN


def test_the_drafters_lookup_flags_mark_the_proposed_chains(tiny_pair):
    d = _drafted(tiny_pair, TreeParams(4, 32, 2, 2, lookup=4), b"one two one two one two one tw", 2)
    flags = d.lookup_flags()
    assert any(flags) and not all(flags) and d._proposed
    t = d.tree
    for i, f in enumerate(flags):
        path = [t.tokens[j] for j in t.path(i)]
        on_chain = any(cont[:len(path)] == path for cont in d._proposed)
        assert f == on_chain, (i, path, d._proposed)


def test_the_cut_reads_the_cost_aware_controllers_estimates_without_observing_them():
    """rapid-cost: one verify curve and one RTT per session, kept by the controller; the cut only
    reads them (observing them too would count every verdict twice)."""
    ctrl = CostAwareCAAC()
    cut = TreeCut(ctrl.costs)
    ctrl.observe_cloud([1, 2, 4], [0.1, 0.2, 0.4], 8, 2)
    cut.observe_cloud([1, 2, 4], [0.5, 0.6, 0.7])  # ignored: the owner recorded the curve
    ctrl.observe_verdict(2, 4, 0.4, 0.05)
    cut.observe_verdict([0.0] * 4, [False] * 4, 9.0, 3.0, [0])  # its verify/RTT ignored, its g learnt
    assert cut.costs is ctrl.costs and ctrl.costs.link.rtt == pytest.approx(0.05)
    assert ctrl.costs.verify.measured == {4: pytest.approx(0.4)}
    assert cut.draft.gain == 0.25
    own = TreeCut()
    own.observe_cloud([1, 2, 4], [0.1, 0.2, 0.4])
    own.observe_verdict([0.0] * 4, [False] * 4, 0.4, 0.05, [0])
    assert own.costs.link.rtt == pytest.approx(0.05) and 4 in own.costs.verify.measured


def _steep_cut() -> TreeCut:
    cut = TreeCut()
    cut.observe_cloud([1, 4, 8, 16], [0.30, 0.31, 0.40, 0.72])  # flat to 4 nodes, then ~8 % of a step per node
    cut.costs.link.observe(0, 0, 0.03)
    return cut


def test_a_step_pays_while_the_cut_would_send_a_node_it_adds():
    cut = _steep_cut()
    tree = [math.log(p) for p in (0.9, 0.7, 0.5, 0.3)]
    assert cut.pays_to_grow(tree, 0.05, math.log(0.3), 2)  # 4 -> 6 nodes: 0.6 tokens for ~0.045 s
    assert not cut.pays_to_grow(tree, 0.05, math.log(0.01), 4)  # 0.04 tokens for ~0.09 s
    assert not cut.pays_to_grow(tree, 0.05, 0.0, 0)  # a step that adds nothing
    assert TreeCut().pays_to_grow(tree, 0.05, math.log(0.01), 4)  # no curve yet: grow as planned
    flat = TreeCut()
    flat.observe_cloud([1, 64], [0.30, 0.30])
    assert flat.pays_to_grow(tree, 0.05, math.log(0.001), 1)  # a node costs nothing: it is sent


@given(st.lists(st.floats(-8, 0), min_size=1, max_size=30), st.floats(-8, 0), st.integers(1, 8),
       st.lists(st.floats(0, 6), min_size=1, max_size=8), st.floats(0, 1), st.floats(0.01, 0.3),
       st.lists(st.floats(0.0, 0.2), min_size=1, max_size=6), st.floats(G_MIN, G_MAX))
def test_a_step_that_cannot_pay_adds_no_node_the_cut_sends(tree, bound, added, drops, draft_s, v1, slopes, gain):
    """The bound is safe: where ``pays_to_grow`` says no, the cut of the grown tree (any number
    up to ``added`` of children, each scoring at most ``bound``) sends none of them, whatever the
    verify curve's shape (here any piecewise linear one, even falling)."""
    cut = TreeCut()
    xs = [1 + 5 * i for i in range(len(slopes) + 1)]
    ys = [v1]
    for s in slopes:
        ys.append(max(0.001, ys[-1] + (s - 0.05) * 5))
    cut.observe_cloud(xs, ys)
    cut.costs.link.observe(0, 0, 0.02)
    cut.draft.predicted, cut.draft.accepted = 1.0, gain  # g = gain
    if cut.pays_to_grow(tree, draft_s, bound, added):
        return
    kids = [bound - d for d in drops[:added]]
    order = sorted([(s, False) for s in tree] + [(s, True) for s in kids], key=lambda x: -x[0])  # stable: old first
    n = best_cut([s for s, _ in order], lambda k: cut.costs.verify.predict(k) or 0.0,
                 draft_s + (cut.costs.link.rtt or 0.0), cut.draft.gain)
    assert not any(new for _, new in order[:n])
