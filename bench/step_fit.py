"""The edge's draft step for ``rapid sim`` (``rapid.bench.calibration``): the uncontended step
samples and how much slower a step runs under each traced contention schedule, in its load and
out of it. Pure data in, a ``StepFit`` out."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field

MIN_SAMPLES = 10  # steps a schedule's (or phase's) slowdown needs


@dataclass(slots=True)
class StepFit:
    step_s: list[float]  # uncontended per-step seconds (samples): the reference
    reference: str  # where they came from
    slowdown: float = 2.0  # loaded / reference median step at intensity cal_intensity
    cal_intensity: float = 1.0
    # per traced schedule: the slowdown of steps in rounds wholly in its load / wholly out of it
    # (a burst schedule's quiet half is not the idle edge of a schedule-free run: ×1.17 on a
    # Zen 3, 2026-12-07: mostly the machine's drift over the run, ≤ 7 % the load's after-effect)
    slowdown_by_schedule: dict[str, float] = field(default_factory=dict)
    idle_slowdown_by_schedule: dict[str, float] = field(default_factory=dict)


def schedule_intensity(scheds: dict, name: str | None) -> float:
    """A traced schedule's load intensity (meta's ``schedules``); 1 where untraced or none."""
    d = scheds.get(name or "none")
    return float(d["intensity"]) if d and d.get("kind") != "none" else 1.0


def fully_loaded(r: dict, scheds: dict) -> bool:
    """A round that ran wholly in its schedule's load (load = intensity × the loaded fraction)."""
    return r.get("load", 0.0) > 0 and r["load"] >= 0.999 * schedule_intensity(scheds, r.get("schedule"))


def steps_timed(r: dict) -> bool:
    """A round whose draft steps were timed on their own (not round 0: it includes the prefill)."""
    return r.get("draft_steps", 0) > 0 and r.get("draft_s", 0) > 0 and r.get("round", 0) > 0


def fit_steps(rounds: list[dict], meta: dict) -> StepFit:
    """The reference is the unloaded steps of the schedule-free cells (where there are
    ``MIN_SAMPLES``), else of every unloaded round, else the warm-up's, else (one loaded schedule,
    nothing unloaded: old traces) the schedule's own steps at slowdown 1."""
    scheds = meta.get("schedules", {})
    step = {id(r): r["draft_s"] / r["draft_steps"] for r in rounds if steps_timed(r)}
    timed = [r for r in rounds if id(r) in step]
    free = [step[id(r)] for r in timed if not r.get("load")]
    idle = [step[id(r)] for r in timed if not r.get("load") and str(r.get("schedule", "none")) == "none"]
    busy = [r for r in timed if r.get("load", 0.0) > 0.5 * schedule_intensity(scheds, r.get("schedule"))]
    fit = StepFit(idle if len(idle) >= MIN_SAMPLES else free, "uncontended rounds")
    if not fit.step_s:
        fit.step_s = [r["draft_s"] / r["draft_steps"] for r in meta.get("warmup_rounds", []) if steps_timed(r)]
        fit.reference = "warm-up rounds (uncontended)"
    traced = {str(r.get("schedule")) for r in rounds}
    if not fit.step_s and busy and len(traced) == 1:
        fit.step_s = [step[id(r)] for r in busy]
        fit.reference = "its own loaded rounds (no uncontended step traced: slowdown unknown)"
        fit.slowdown_by_schedule = {traced.pop(): 1.0}  # ...so simulated under it, at its own speed
        return fit
    if not fit.step_s or not busy:
        fit.step_s = fit.step_s or [0.05]
        return fit
    ref = statistics.median(fit.step_s)
    fit.slowdown = max(1.0, statistics.median(step[id(r)] for r in busy) / ref)
    fit.cal_intensity = statistics.median(schedule_intensity(scheds, r.get("schedule")) for r in busy)
    on: dict[str, list[float]] = defaultdict(list)
    off: dict[str, list[float]] = defaultdict(list)
    for r in timed:
        name = str(r.get("schedule", "none"))
        if fully_loaded(r, scheds):
            on[name].append(step[id(r)])
        elif not r.get("load") and name != "none":
            off[name].append(step[id(r)])
    fit.slowdown_by_schedule = {k: max(1.0, statistics.median(v) / ref) for k, v in on.items() if len(v) >= MIN_SAMPLES}
    fit.idle_slowdown_by_schedule = {k: statistics.median(v) / ref for k, v in off.items()
                                     if len(v) >= MIN_SAMPLES and k in fit.slowdown_by_schedule}
    return fit
