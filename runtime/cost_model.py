"""What a round costs and what it yields, as the edge measures them (inputs of the cost-aware depth).

Pure: no clocks, no I/O; the coordinator (or ``rapid sim``) measures and passes plain numbers.

Acceptance per level (``ReachEstimate``). A round that drafted ``D`` levels and had ``a``
accepted (``0 <= a <= D``) tells, for each level ``d <= min(a + 1, D)``, whether a path that had
reached level ``d - 1`` went on to level ``d`` (yes for ``d <= a``, no for ``d = a + 1 <= D``).
With forgetting at ``alpha_reach`` per round (counts ``n_d`` trials, ``s_d`` successes)::

    s_d, n_d <- (1 - alpha_reach) * (s_d, n_d) + this round's events at level d
    h0  = (S + w * p0) / (N + w)              pooled over every level (S = sum s_d, N = sum n_d)
    h_d = (s_d + w * h0) / (n_d + w)          level d, shrunk towards the pooled rate
    P(reach d) = prod_{k <= d} h_k            E[accepted | D] = sum_{d=1..D} P(reach d)

A level never drafted reads the pooled rate (the i.i.d. model ``oracle-load`` uses), a level
drafted often reads its own: in a token tree the first levels hold the most alternatives, so
``h_d`` falls with ``d``. Defaults: ``p0 = 0.7`` (about the per-token acceptance of the
CPU-calibrated traces of bench-out/vs-ar-1: 0.75 on c4, 0.93 on oasst, lower on the others),
``w = 2`` (two pseudo-rounds: a level's own rate dominates after a few rounds),
``alpha_reach = 0.05`` (about 20 rounds of memory, one 48-token generation at 2-3 tokens per
round). In ``rapid sim`` over those traces (5 sets x none/sustained x {CPU verify and steps, lan;
A100-like verify and 9 ms steps, lan and wan}), rapid-cost's macro mean against ``oracle-load``
moves by at most 0.7 % for ``alpha_reach`` 0.02 / 0.1, ``p0`` 0.5 / 0.85 or ``w = 5``: the
defaults are not a tuned optimum, and nothing rests on their exact values.

Across requests (``ReachEstimate.carry``, called by ``CostAwareCAAC.new_request``). The edge daemon
and the bench keep one controller per policy, so a request starts with the last one's counts::

    s_d, n_d <- k * (s_d, n_d),   k = min(1, request_rounds / n_1)      (n_1: drafted rounds counted)

The per-level rates stay (the prior), but weigh as at most ``request_rounds`` (4) rounds against
the new request's own. With the whole memory (~20 rounds) a text the draft follows well that came
after one it follows badly kept the old depth for half its generation (``rapid bench --vs-ar`` on
the Zen 4: humaneval after c4 at depth 2-3 for 10 rounds, most fully accepted); with the cap,
paired in one run, +2.8 % / +2.9 % over the five sets in two runs (docs/controller.md).

Verify time by tree size (``VerifyCurve``). The start-up curve ``C`` from the cloud's
``Ready`` (one tree forward of ``n`` nodes after the root) gives the shape; every verdict's
``verify_s`` for its tree of ``n`` nodes gives the level, per size::

    M[n] <- M[n] + alpha_verify * (verify_s - M[n])     (a first sample at n: M[n] = verify_s)
    V(x) = C(x)                                 no verdict yet
         = C(x) * r(x)                          r(n) = M[n] / C(n) at the sizes n in M, piecewise
                                                linear between them, flat outside (the nearer one)
         = M(x)                                 without a start-up curve
    (C(x), M(x): piecewise linear over their points, the end segments extended, flat with one point)

So the curve keeps its start-up shape between the sizes the verdicts measured, at their level: a
step where the kernels change tile (AMX: T=16 250 ms, T=17 279, flat to 32) stays a step where
a line through verdicts at 14 and 31 nodes would price 16-20 nodes below their cost. And a
verdict's size never reads as a dip in a curve measured by another clock: ``verify_s``
includes the acceptance walk and the cloud's batching and load, the start-up forward does not,
and the two can differ by a factor (a tiny test model verifies in 1-2 ms against the 20 ms a
test cloud reports). ``alpha_verify = 0.2``: about 5 verdicts of memory per size. At most
``MAX_POINTS`` sizes are kept (trees have at most 64 nodes: every size fits).

Round-trip time and tree size (``LinkCost``)::

    RTT  <- EMA(arrival - send - verify_s) at alpha_rtt     (the link's part of a round)
    n(D) <- EMA(tree nodes of a round that drafted D levels) at alpha_rtt; unseen D:
            n(D) = min(budget, n(D') * D / D') for the nearest seen D', else min(budget, width * D)

``alpha_rtt = 0.3`` as CAAC's ``alpha_cloud`` (RTT jitter smoothed over ~3 rounds).

Kept proactive branches (``BranchYield``): how often the branch drafted during the wait is kept,
after a fully and after a partly accepted round (0 until seen)::

    k_full <- EMA(hit | accepted == depth),  k_part <- EMA(hit | accepted < depth)   at alpha_reach

They differ by an order of magnitude (c4 traces of bench-out/vs-ar-1: 0.62 and 0.03): the
branch guesses where the path ends, and a fully accepted tree ends at one of its leaves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

__all__ = ["BranchYield", "CloudCosts", "CostConfig", "LinkCost", "ReachEstimate", "VerifyCurve", "interpolate", "interpolate_sorted"]

MAX_POINTS = 128  # node counts kept by the verify curve (trees have at most 64 nodes)


@dataclass(slots=True, frozen=True)
class CostConfig:
    """The constants of the cost model (see the module docstring for the formulas)."""

    p0: float = 0.7  # prior per-level acceptance before any round
    prior_weight: float = 2.0  # w: pseudo-rounds pulling a level towards the pooled rate
    alpha_reach: float = 0.05  # forgetting of the per-level counts, per round
    request_rounds: float = 4.0  # a new request starts with the carried counts worth at most this many
    # rounds (ReachEstimate.carry): the last request's text is a prior, not this one's evidence
    alpha_verify: float = 0.2  # EMA rate of a verify-curve point from verdicts
    alpha_rtt: float = 0.3  # EMA rate of the RTT and of the tree size per depth
    max_undrafted: int = 4  # rounds in a row that may skip drafting (depth 0) before one drafts to
    # re-measure the step and the acceptance (rapid.runtime.cost_caac); 0: every round drafts
    skip_margin: float = 0.05  # a round drafts nothing only where that beats drafting by this much
    open_skip_margin: float = 0.25  # ... by this much while the edge is not measurably slowed
    slow_steps: int = 2  # ... and only after this many measured steps in a row each slower than
    # CAAC's band on its own (s / tau_hat(T) > band_hi): one jitter spike shuts the gate (rapid.runtime.cost_caac)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"CostConfig.{f.name} must be a finite number, got {v!r}")
        if not 0 < self.p0 < 1:
            raise ValueError(f"CostConfig.p0 must be in (0, 1), got {self.p0}")
        if self.prior_weight <= 0:
            raise ValueError(f"CostConfig.prior_weight must be > 0, got {self.prior_weight}")
        if not isinstance(self.max_undrafted, int) or self.max_undrafted < 0:
            raise ValueError(f"CostConfig.max_undrafted must be an int >= 0, got {self.max_undrafted!r}")
        if not isinstance(self.slow_steps, int) or self.slow_steps < 1:
            raise ValueError(f"CostConfig.slow_steps must be an int >= 1, got {self.slow_steps!r}")
        for name in ("skip_margin", "open_skip_margin", "request_rounds"):
            if getattr(self, name) < 0:
                raise ValueError(f"CostConfig.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("alpha_reach", "alpha_verify", "alpha_rtt"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"CostConfig.{name} must be in (0, 1], got {getattr(self, name)}")


def interpolate(x: float, points: dict[int, float]) -> float | None:
    """Piecewise linear through ``points`` (key -> value), end segments extended; flat with one
    point; None without points."""
    if not points:
        return None
    xs = sorted(points)
    return interpolate_sorted(x, xs, [points[k] for k in xs])


def interpolate_sorted(x: float, xs: Sequence[float], ys: Sequence[float]) -> float:
    """Piecewise linear through (xs[i], ys[i]), ``xs`` ascending and not empty: the segment of
    the first ``xs[i] >= x`` (the end segments extended), flat with one point; equal neighbours
    divide by 1e-9 instead of 0."""
    if len(xs) == 1:
        return ys[0]
    i = 1
    while i < len(xs) - 1 and x > xs[i]:
        i += 1
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (x - x0) * (y1 - y0) / max(x1 - x0, 1e-9)


class ReachEstimate:
    """P(the accepted path reaches level d), from per-level counts; see the module docstring."""

    __slots__ = ("config", "max_depth", "succ", "trials")

    def __init__(self, max_depth: int, config: CostConfig | None = None) -> None:
        self.config = config or CostConfig()
        self.max_depth = max_depth
        self.succ = [0.0] * (max_depth + 1)  # index d = level d (0 unused)
        self.trials = [0.0] * (max_depth + 1)

    def copy(self) -> ReachEstimate:
        c = ReachEstimate(self.max_depth, self.config)
        c.succ, c.trials = list(self.succ), list(self.trials)
        return c

    def carry(self, rounds: float) -> None:
        """Into a new request: scale every count by ``min(1, rounds / n_1)`` (``n_1``: the rounds
        counted at level 1, every drafted round), so the per-level rates stay and weigh as at most
        ``rounds`` rounds against the new request's own."""
        n1 = self.trials[1] if self.max_depth >= 1 else 0.0
        if n1 > rounds:
            k = rounds / n1
            self.succ = [x * k for x in self.succ]
            self.trials = [x * k for x in self.trials]

    def observe(self, accepted: int, depth: int, first_level: int = 1) -> None:
        """One verified round: ``accepted`` (clamped to ``depth``) of ``depth`` levels, its levels
        from ``first_level`` on (a request's first verdict starts at 2: ``CostAwareCAAC``); a
        round with no level to count is no round of the memory either."""
        depth = min(depth, self.max_depth)
        a = min(accepted, depth)
        if min(a + 1, depth) < first_level:
            return
        keep = 1.0 - self.config.alpha_reach
        self.succ = [s * keep for s in self.succ]
        self.trials = [n * keep for n in self.trials]
        for d in range(first_level, min(a + 1, depth) + 1):
            self.trials[d] += 1.0
            self.succ[d] += 1.0 if d <= a else 0.0

    def pooled(self) -> float:
        c = self.config
        return (sum(self.succ) + c.prior_weight * c.p0) / (sum(self.trials) + c.prior_weight)

    def level_rates(self) -> list[float]:
        """``[h_1, ..., h_max_depth]``."""
        w, h0 = self.config.prior_weight, self.pooled()
        return [(self.succ[d] + w * h0) / (self.trials[d] + w) for d in range(1, self.max_depth + 1)]

    def reach(self) -> list[float]:
        """``[P(reach 1), ..., P(reach max_depth)]``."""
        out, p = [], 1.0
        for h in self.level_rates():
            p *= h
            out.append(p)
        return out


class VerifyCurve:
    """Verify seconds by tree nodes: the start-up curve's shape at the verdicts' level (module docstring)."""

    __slots__ = ("alpha", "startup", "measured", "_level")

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = alpha
        self.startup: dict[int, float] = {}  # C: nodes -> seconds, from Ready
        self.measured: dict[int, float] = {}  # M: nodes -> EMA of verdicts' verify_s
        self._level: tuple[list[int], list[float]] | None = None  # r's points, from C and M; None: stale

    def start(self, nodes: list[int], seconds: list[float]) -> None:
        """Replace the start-up curve by the cloud's (ignores negative sizes, non-finite or
        non-positive times; an empty or wholly invalid curve keeps the old one)."""
        pts = {int(n): float(s) for n, s in zip(nodes, seconds, strict=True)
               if n >= 0 and math.isfinite(s) and s > 0}
        if pts:
            self.startup = dict(sorted(pts.items())[:MAX_POINTS])
            self._level = None

    def observe(self, nodes: int, seconds: float) -> None:
        if nodes < 0 or not math.isfinite(seconds) or seconds <= 0:
            return
        old = self.measured.get(nodes)
        if old is None:
            if len(self.measured) >= MAX_POINTS:
                return
            self.measured[nodes] = seconds
        else:
            self.measured[nodes] = old + self.alpha * (seconds - old)
        self._level = None

    def predict(self, nodes: float) -> float | None:
        """``V(nodes)``, or None while neither curve has a point."""
        m, c = self.measured, self.startup
        if not m or not c:
            v = interpolate(nodes, c or m)
        else:
            xs, level = self._levels()
            if not level:  # a start-up curve extended below zero: its shape says nothing here
                v = interpolate(nodes, m)
            else:
                v = (interpolate(nodes, c) or 0.0) * interpolate_sorted(min(max(nodes, xs[0]), xs[-1]), xs, level)
        return None if v is None else max(v, 0.0)

    def _levels(self) -> tuple[list[int], list[float]]:
        """(the measured sizes ascending, r = M / C at each; [] where C is not positive at one),
        kept until ``start`` or ``observe`` changes C or M: the cut asks ``predict`` for every size."""
        if self._level is None:
            xs = sorted(self.measured)
            base = [interpolate(n, self.startup) or 0.0 for n in xs]
            level = [] if min(base) <= 0 else [self.measured[n] / b for n, b in zip(xs, base, strict=True)]
            self._level = (xs, level)
        return self._level


class LinkCost:
    """The link's round-trip time and the tree size per depth (module docstring)."""

    __slots__ = ("alpha", "rtt", "nodes", "budget", "width")

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.rtt: float | None = None
        self.nodes: dict[int, float] = {}
        self.budget = 0  # 0 = not told
        self.width = 1

    def observe(self, depth: int, nodes: int, rtt_s: float | None) -> None:
        if rtt_s is not None and math.isfinite(rtt_s):
            r = max(0.0, rtt_s)
            self.rtt = r if self.rtt is None else self.rtt + self.alpha * (r - self.rtt)
        if depth >= 1 and nodes >= 0:
            old = self.nodes.get(depth)
            self.nodes[depth] = float(nodes) if old is None else old + self.alpha * (nodes - old)

    def tree_nodes(self, depth: int) -> float:
        """``n(depth)``: measured, else scaled from the nearest measured depth, else width * depth."""
        if depth <= 0:
            return 0.0
        cap = float(self.budget) if self.budget > 0 else math.inf
        if depth in self.nodes:
            return self.nodes[depth]
        if self.nodes:
            near = min(self.nodes, key=lambda d: (abs(d - depth), d))
            return min(cap, self.nodes[near] * depth / near)
        return min(cap, float(self.width * depth))


@dataclass(slots=True)
class CloudCosts:
    """The cloud's share of a round as one session measures it: the verify curve and the link.
    One set per session, observed by its owner (``CostAwareCAAC`` where the policy prices depth,
    else the send cut) and read by both, so the two never hold diverging estimates."""
    verify: VerifyCurve
    link: LinkCost

    @classmethod
    def fresh(cls, alpha_verify: float, alpha_rtt: float) -> CloudCosts:
        return cls(VerifyCurve(alpha_verify), LinkCost(alpha_rtt))


class BranchYield:
    """The rate at which a proactive branch is kept, after full / partial acceptance (module docstring)."""

    __slots__ = ("alpha", "full", "part")

    def __init__(self, alpha: float = 0.05) -> None:
        self.alpha = alpha
        self.full: float | None = None
        self.part: float | None = None

    def observe(self, full: bool, hit: bool) -> None:
        x = 1.0 if hit else 0.0
        old = self.full if full else self.part
        new = x if old is None else old + self.alpha * (x - old)
        if full:
            self.full = new
        else:
            self.part = new

    def rate(self, full: bool) -> float:
        v = self.full if full else self.part
        return 0.0 if v is None else v
