"""The steps beside the verify, for ``rapid sim`` (``rapid.bench.calibration``): how much slower a
proactive branch's or a catch-up step runs than a drafting step feeding as many tokens, and how
many tokens such a step feeds. Pure data in, a ``BesideFit`` out.

Where edge and cloud share a host, a step that runs while the target verifies shares the
memory bandwidth with that forward on the other core; the runtime keeps those steps apart
(``rapid.runtime.step_cost``: ``beside``). A branch's first step also feeds more than a drafting
step (the leaves of the tree sent and the roots below them), and a catch-up step every token the
round left pending. From the traces' ``beside_s`` / ``beside_tokens`` (seconds and tokens of a
round's steps beside its verify; traces before 2026-12-07 have neither: the fit is neutral)::

    n        = proactive_steps (a branch), else 1 (a catch-up step, ``catch_up_s`` > 0)
    tax      = median over unloaded rounds of  beside_s / (n · median(step_s) · scale(beside_tokens / n))
    tokens   = mean of beside_tokens / n, per policy for branches, over every policy for catch-ups

``scale`` is the calibration's step cost by tokens (``Calibration.step_scale``), so the sim's
step of ``tokens`` tokens times ``tax`` takes the traced time whatever the shape of that curve.
Only unloaded rounds: in a load the sim scales every step by the load's slowdown already.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from rapid.bench.step_fit import MIN_SAMPLES


@dataclass(slots=True)
class BesideFit:
    tax: float = 1.0  # a beside step / a drafting step of as many tokens (1.0: untraced)
    branch_tokens: dict[str, float] = field(default_factory=dict)  # per policy: tokens per branch step
    catch_up_tokens: float | None = None  # tokens per catch-up step (None: untraced)


def _beside_steps(r: dict) -> int:
    if r.get("proactive_steps", 0) > 0:
        return int(r["proactive_steps"])
    return 1 if r.get("catch_up_s", 0.0) > 0 else 0


def fit_beside(rounds: list[dict], step_s: list[float], scale: Callable[[float], float]) -> BesideFit:
    """The module docstring's fit over ``rounds`` (round 0 left out: its branch runs beside the
    prefill); ``step_s``: the calibration's uncontended drafting steps."""
    traced = [r for r in rounds if r.get("beside_s", 0.0) > 0 and r.get("beside_tokens", 0) > 0
              and _beside_steps(r) > 0 and r.get("round", 0) > 0]
    fit = BesideFit()
    if not traced or not step_s:
        return fit
    ref = statistics.median(step_s)
    ratios = [r["beside_s"] / (n * ref * scale(r["beside_tokens"] / n))
              for r in traced if not r.get("load") and (n := _beside_steps(r))]
    if len(ratios) >= MIN_SAMPLES and ref > 0:
        fit.tax = statistics.median(ratios)
    per_policy: dict[str, list[float]] = defaultdict(list)
    catch_up: list[float] = []
    for r in traced:
        n = _beside_steps(r)
        if r.get("proactive_steps", 0) > 0:
            per_policy[str(r.get("policy"))].append(r["beside_tokens"] / n)
        else:
            catch_up.append(r["beside_tokens"])
    fit.branch_tokens = {p: statistics.fmean(v) for p, v in per_policy.items()}
    fit.catch_up_tokens = statistics.fmean(catch_up) if catch_up else None
    return fit
