"""How many of a drafted tree's nodes to send: expected accepted tokens per second of the round.

A tree is grown best-first, so its nodes sorted by score (cumulative draft log-probability)
form a chain of ancestor-closed prefixes. Under greedy verification the accepted length is the
number of sent nodes on the target's path, so its expectation is the sum over sent nodes of
P(node on the path) ~ exp(score) if the draft were calibrated; ``g`` corrects that from the
verdicts. Sending the ``n`` best nodes makes a round of::

    rate(n) = (1 + g · Σ_{i<n} exp(s_i)) / (fixed_s + V(n))            (the bonus token: the 1)
    fixed_s = this round's drafting seconds + RTT                        (n-independent)
    n*      = argmax_{1 <= n <= N} rate(n)          (ties: the smaller n)

``V`` is the cloud's verify curve (``rapid.runtime.cost_model.VerifyCurve``: the start-up curve's
shape at the verdicts' level), ``RTT`` the link's share of a wait (``LinkCost``). Where the
curve is flat a node costs nothing and every node is sent; where rows are compute-bound (an fp32
target on a CPU: past ~6-8 rows each row costs ~5-10 % of a step) a node is sent only while
its expected tokens pay for its verify time. The calibration, from each verdict, kept apart
for the draft's nodes and for the prompt-lookup chains' (``c`` = draft | lookup: a lookup token
scores log of its request's learnt hit rate, already calibrated, so the over-confident draft's
correction must not discount it), each class updated only by verdicts that sent some of it::

    P_c <- P_c + alpha · (Σ_{sent, class c} exp(s_i) - P_c)
    A_c <- A_c + alpha · (accepted nodes of class c - A_c)
    g_c  = clamp(A_c / P_c, G_MIN, G_MAX)       (1 before any verdict)

and node i counts ``g_{c(i)} · exp(s_i)`` expected tokens (a node on a lookup chain is of class
lookup, whether or not the draft proposed it too).

**Drafting no level the cut would drop** (``TreeCut.pays_to_grow``, asked by ``Drafter.draft``
before each step after the first): a step feeds the best expandable nodes and adds their
children, and a child scores at most its parent, so the step adds at most ``k`` = fed × topk
nodes, each scoring at most ``s_b`` = the best fed node's score. The step is skipped (and the
drafting stops) where the cut, given the tree plus ``k`` nodes of score ``s_b`` (ordered before
equal scores) and ``fixed_s`` grown by the drafting so far and one more step, would send none of
them: then it would send none of the real ones either (a prefix holding real children holds no
more tokens than the same-length prefix holding the bound's nodes, at the same ``V``; exact for a
tree of draft nodes alone, whatever the curve's shape; with lookup nodes, calibrated apart, a
close bound), and the step only lengthens the round (if it costs what the last one did).
Without it the cost-aware depth drafted levels the cut then dropped: 7-12 % of rapid-cost's wall
time on c4 / mtbench / wikitext at 128 tokens (`bench-out/zen2-vsar-128`, Zen 2, fp32 target,
verify flat to 7 nodes), 1-2 % of ``rapid``'s.

Pure numbers in and out: the coordinator measures and passes them. Which node the target
accepts never depends on the cut (the cloud verifies whatever it is sent), so the cut moves
speed only, never the output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rapid.runtime.cost_model import CloudCosts

__all__ = ["TreeCut", "best_cut"]

G_MIN, G_MAX = 0.2, 5.0  # the calibration's clamp: a draft is not off by more than 5x either way
ALPHA = 0.2  # EMA rate of the calibration and of the curve's measured points (~5 verdicts)


def best_cut(scores: Sequence[float], verify_s: Callable[[int], float], fixed_s: float,
             gain: float | Sequence[float] = 1.0) -> int:
    """``n*`` of the module docstring for ``scores`` sorted descending (``len(scores)`` >= 1);
    ``gain``: one calibration for every node, or one per node (aligned with ``scores``)."""
    gains = [gain] * len(scores) if isinstance(gain, int | float) else gain
    best_n, best_rate, tokens = 1, -math.inf, 1.0
    for n, (s, g) in enumerate(zip(scores, gains, strict=True), start=1):
        tokens += g * math.exp(s)
        rate = tokens / max(fixed_s + verify_s(n), 1e-9)
        if rate > best_rate:
            best_n, best_rate = n, rate
    return best_n


@dataclass(slots=True)
class Calibration:
    """``g`` of one class of nodes: accepted nodes per unit of predicted probability (EMAs)."""
    predicted: float | None = None
    accepted: float | None = None

    def observe(self, predicted: float, accepted: int) -> None:
        if self.predicted is None or self.accepted is None:
            self.predicted, self.accepted = predicted, float(accepted)
        else:
            self.predicted += ALPHA * (predicted - self.predicted)
            self.accepted += ALPHA * (accepted - self.accepted)

    @property
    def gain(self) -> float:
        if not self.predicted or self.accepted is None:
            return 1.0
        return min(G_MAX, max(G_MIN, self.accepted / self.predicted))


class TreeCut:
    """The cut's calibrations (draft, lookup) and its decision, over the session's cloud costs.

    ``costs``: the verify curve and RTT another observer keeps (``CostAwareCAAC.costs``); the cut
    then only reads them. Without, the cut keeps and observes its own."""

    __slots__ = ("costs", "_owns_costs", "draft", "lookup")

    def __init__(self, costs: CloudCosts | None = None) -> None:
        self._owns_costs = costs is None
        self.costs = costs if costs is not None else CloudCosts.fresh(ALPHA, ALPHA)
        self.draft = Calibration()
        self.lookup = Calibration()

    def observe_cloud(self, curve_nodes: Sequence[int], curve_s: Sequence[float]) -> None:
        """A session opened: the cloud's start-up verify curve (its owner records it)."""
        if self._owns_costs:
            self.costs.verify.start(list(curve_nodes), list(curve_s))

    def observe_verdict(self, scores: Sequence[float], lookup: Sequence[bool], verify_s: float,
                        rtt_s: float | None, path: Sequence[int]) -> None:
        """A verdict for the sent tree (its nodes' ``scores`` and ``lookup`` flags): its verify
        time and the link's share (recorded where the cut owns the costs), the accepted ``path``
        (node indices)."""
        if not scores:
            return
        if self._owns_costs:
            self.costs.verify.observe(len(scores), verify_s)
            self.costs.link.observe(0, 0, rtt_s)
        on_lookup = sum(1 for i in path if lookup[i])
        for cal, mine, accepted in ((self.draft, False, len(path) - on_lookup), (self.lookup, True, on_lookup)):
            predicted = [math.exp(s) for s, f in zip(scores, lookup, strict=True) if f == mine]
            if predicted:
                cal.observe(sum(predicted), accepted)

    def nodes(self, scores: Sequence[float], draft_s: float, lookup: Sequence[bool] | None = None) -> int:
        """How many of the nodes (``scores`` in any order, ``lookup`` flags aligned: none by
        default) to send: all while no curve is known."""
        if len(scores) <= 1 or self.costs.verify.predict(1) is None:
            return len(scores)
        return self._prefix(_tagged(scores, lookup), draft_s)[0]

    def pays_to_grow(self, scores: Sequence[float], draft_s: float, bound: float, added: int,
                     lookup: Sequence[bool] | None = None) -> bool:
        """Would the cut send any of ``added`` draft nodes scoring ``bound`` joined to the tree
        (``scores``, ``lookup`` flags) after ``draft_s`` seconds of drafting (module docstring)?
        True while no curve is known; False for ``added`` <= 0."""
        if added <= 0:
            return False
        if self.costs.verify.predict(1) is None:
            return True
        n, order = self._prefix(_tagged(scores, lookup) + [(bound, False, True)] * added, draft_s)
        return any(new for _, _, new in order[:n])

    def _prefix(self, nodes: list[tuple[float, bool, bool]], draft_s: float) -> tuple[int, list[tuple[float, bool, bool]]]:
        """``nodes`` (score, lookup, new) best first by score (a new node before an equal old one,
        else in the given order) and the cut's ``n*`` over that order."""
        verify = self.costs.verify
        order = sorted(nodes, key=lambda x: (-x[0], not x[2]))
        gains = [self.lookup.gain if f else self.draft.gain for _, f, _ in order]
        fixed = max(0.0, draft_s) + (self.costs.link.rtt or 0.0)
        return best_cut([s for s, _, _ in order], lambda k: verify.predict(k) or 0.0, fixed, gains), order


def _tagged(scores: Sequence[float], lookup: Sequence[bool] | None) -> list[tuple[float, bool, bool]]:
    """(score, lookup flag, new = False) per node of a drafted tree (no flags: none on a chain)."""
    flags = lookup if lookup is not None else [False] * len(scores)
    return [(s, f, False) for s, f in zip(scores, flags, strict=True)]
