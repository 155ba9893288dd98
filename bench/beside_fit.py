"""The steps beside the verify, for ``rapid sim`` (``rapid.bench.calibration``): how long a
proactive branch's or a catch-up step takes against a drafting step, and how many tokens it
feeds. Pure data in, a ``BesideFit`` out.

Where edge and cloud share a host, a step that runs while the target verifies shares the
memory bandwidth with that forward on the other core; the runtime keeps those steps apart
(``rapid.runtime.step_cost``: ``beside``). Its size differs too: a branch's first step feeds the
leaves of the tree sent and the roots below them, a catch-up step every token the round left
pending. From the traces' ``beside_s`` / ``beside_tokens`` (seconds and tokens of a round's steps
beside its verify; traces before 2026-12-07 have neither: the fit is empty)::

    n              = proactive_steps (a branch), else 1 (a catch-up step, ``catch_up_s`` > 0)
    ratio[kind]    = median over unloaded rounds of beside_s / n, over median(step_s)
    tokens[kind]   = mean of beside_tokens / n
    (kind: each policy's branch, and the catch-up steps of every policy)

The sim runs a beside step as a drafting step times ``ratio`` (in a load, times the load's
slowdown as every step), at the traced size whatever the calibration's cost-by-tokens curve says:
on the row kernels a step's cost hardly grows with its tokens, so a linear curve would have made a
1.8-token branch step cheaper than a 2-token drafting step where the traces show it 1.2x dearer
(Zen 3, ``zen3-slow4``). A ratio needs ``MIN_SAMPLES`` rounds; without one, or for a cloud
elsewhere (no shared memory: ``colocated`` False), a beside step costs a drafting step of its
traced tokens (``Calibration.step_scale``).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from rapid.bench.step_fit import MIN_SAMPLES

CATCH_UP = "catch-up"  # the kind of a catch-up step (branches are keyed by policy)


@dataclass(slots=True)
class BesideFit:
    ratio: dict[str, float] = field(default_factory=dict)  # kind -> traced beside step / median drafting step
    tokens: dict[str, float] = field(default_factory=dict)  # kind -> tokens one such step feeds
    colocated: bool = True  # False: a cloud elsewhere (no ratio applies)

    def scale(self, kind: str, step_scale: Callable[[float], float], default_tokens: float) -> float:
        """A ``kind`` step's time over a drafting step's (module docstring)."""
        if self.colocated and kind in self.ratio:
            return self.ratio[kind]
        return step_scale(self.tokens.get(kind, default_tokens))

    def step_tokens(self, kind: str, default: float) -> int:
        """The tokens a ``kind`` step feeds, as traced (``default`` where untraced)."""
        return max(1, round(self.tokens.get(kind, default)))


def _kind(r: dict) -> str | None:
    if r.get("proactive_steps", 0) > 0:
        return str(r.get("policy"))
    return CATCH_UP if r.get("catch_up_s", 0.0) > 0 else None


def fit_beside(rounds: list[dict], step_s: list[float]) -> BesideFit:
    """The module docstring's fit over ``rounds`` (round 0 left out: its branch runs beside the
    cloud's prefill); ``step_s``: the calibration's uncontended drafting steps."""
    seconds: dict[str, list[float]] = defaultdict(list)
    tokens: dict[str, list[float]] = defaultdict(list)
    for r in rounds:
        kind = _kind(r)
        if kind is None or r.get("round", 0) <= 0 or r.get("beside_s", 0.0) <= 0 or r.get("beside_tokens", 0) <= 0:
            continue
        n = r["proactive_steps"] if kind != CATCH_UP else 1
        tokens[kind].append(r["beside_tokens"] / n)
        if not r.get("load"):
            seconds[kind].append(r["beside_s"] / n)
    ref = statistics.median(step_s) if step_s else 0.0
    return BesideFit({k: statistics.median(v) / ref for k, v in seconds.items() if len(v) >= MIN_SAMPLES and ref > 0},
                     {k: statistics.fmean(v) for k, v in tokens.items()})
