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
its expected tokens pay for its verify time. The calibration, from each verdict::

    P <- P + alpha · (Σ_{sent} exp(s_i) - P),   A <- A + alpha · (accepted - A)
    g  = clamp(A / P, G_MIN, G_MAX)             (1 before any verdict)

Pure numbers in and out: the coordinator measures and passes them. Which node the target
accepts never depends on the cut (the cloud verifies whatever it is sent), so the cut moves
speed only, never the output.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from rapid.runtime.cost_model import LinkCost, VerifyCurve

__all__ = ["TreeCut", "best_cut"]

G_MIN, G_MAX = 0.2, 5.0  # the calibration's clamp: a draft is not off by more than 5x either way
ALPHA = 0.2  # EMA rate of the calibration and of the curve's measured points (~5 verdicts)


def best_cut(scores: Sequence[float], verify_s: Callable[[int], float], fixed_s: float, gain: float = 1.0) -> int:
    """``n*`` of the module docstring for ``scores`` sorted descending (``len(scores)`` >= 1)."""
    best_n, best_rate, tokens = 1, -math.inf, 1.0
    for n, s in enumerate(scores, start=1):
        tokens += gain * math.exp(s)
        rate = tokens / max(fixed_s + verify_s(n), 1e-9)
        if rate > best_rate:
            best_n, best_rate = n, rate
    return best_n


class TreeCut:
    """The cut's estimates (verify curve, RTT, calibration) and its decision."""

    __slots__ = ("_verify", "_link", "_predicted", "_accepted")

    def __init__(self) -> None:
        self._verify = VerifyCurve(ALPHA)
        self._link = LinkCost(ALPHA)
        self._predicted: float | None = None
        self._accepted: float | None = None

    def observe_cloud(self, curve_nodes: Sequence[int], curve_s: Sequence[float]) -> None:
        """A session opened: the cloud's start-up verify curve."""
        self._verify.start(list(curve_nodes), list(curve_s))

    def observe_verdict(self, scores: Sequence[float], verify_s: float, rtt_s: float | None, accepted: int) -> None:
        """A verdict for the tree of ``scores``: its verify time, the link's share, its accepted length."""
        if not scores:
            return
        self._verify.observe(len(scores), verify_s)
        self._link.observe(0, 0, rtt_s)
        predicted = sum(math.exp(s) for s in scores)
        if self._predicted is None or self._accepted is None:
            self._predicted, self._accepted = predicted, float(accepted)
        else:
            self._predicted += ALPHA * (predicted - self._predicted)
            self._accepted += ALPHA * (accepted - self._accepted)

    @property
    def gain(self) -> float:
        """``g``: how many accepted tokens a unit of predicted probability has been worth."""
        if not self._predicted or self._accepted is None:
            return 1.0
        return min(G_MAX, max(G_MIN, self._accepted / self._predicted))

    def nodes(self, scores: Sequence[float], draft_s: float) -> int:
        """How many of the nodes (``scores`` in any order) to send: all while no curve is known."""
        if len(scores) <= 1 or self._verify.predict(1) is None:
            return len(scores)
        order = sorted(scores, reverse=True)
        fixed = max(0.0, draft_s) + (self._link.rtt or 0.0)
        return best_cut(order, lambda n: self._verify.predict(n) or 0.0, fixed, self.gain)
