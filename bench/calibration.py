"""Calibration of ``rapid sim`` from ``rapid bench`` traces (or a GPU verify-time profile):
edge step time and contention slowdown, verify time vs tree size, transport overhead, start-up,
acceptance replay. Pure data in, a ``Calibration`` out."""

from __future__ import annotations

import json
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from rapid.bench.report import read_jsonl


# ---------------------------------------------------------------------------------------------
# calibration
@dataclass(slots=True)
class Calibration:
    step_s: list[float]  # uncontended per-step seconds (samples)
    slowdown: float = 2.0  # contended / uncontended median step time at intensity cal_intensity
    cal_intensity: float = 1.0
    verify_a: float = 0.05  # verify seconds = verify_a + verify_b * nodes (batch: total nodes)
    verify_b: float = 0.005
    gpu_profile: tuple[list[float], list[float]] | None = None  # (nodes, seconds), interpolated
    overhead_s: float = 0.002  # transport/framing per round, beyond verify and the profile RTT
    startup_s: float = 0.0  # per generation: connect + prefill (wall - sum of rounds)
    tokens_per_step: float = 2.0
    match_bits: list[int] = field(default_factory=lambda: [1, 1, 0])
    p_accept: float = 0.6  # per-token acceptance (for censored rounds)
    p_hit_full: float = 0.5  # proactive hit rate after a fully accepted round
    p_hit_part: float = 0.3  # ... after a partly accepted round
    depth: int = 4
    nodes_by_depth: dict[int, float] = field(default_factory=dict)
    budget: int = 8
    source: str = ""

    def verify(self, nodes: float) -> float:
        if self.gpu_profile is not None:
            xs, ys = self.gpu_profile
            return _interp(nodes, xs, ys)
        return max(1e-4, self.verify_a + self.verify_b * nodes)

    def nodes(self, depth: int) -> float:
        if depth <= 0:
            return 0.0
        if depth in self.nodes_by_depth:
            return self.nodes_by_depth[depth]
        return float(min(self.budget, 2 * depth))

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in self.__slots__ if k not in ("step_s", "match_bits")}
        d["step_s_median"] = statistics.median(self.step_s) if self.step_s else None
        d["step_samples"] = len(self.step_s)
        d["match_bits"] = len(self.match_bits)
        d["nodes_by_depth"] = {str(k): v for k, v in self.nodes_by_depth.items()}
        return d


def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    if x <= xs[0]:
        return ys[0] if len(xs) == 1 else ys[0] + (x - xs[0]) * (ys[1] - ys[0]) / max(xs[1] - xs[0], 1e-9)
    for i in range(1, len(xs)):
        if x <= xs[i]:
            return ys[i - 1] + (x - xs[i - 1]) * (ys[i] - ys[i - 1]) / max(xs[i] - xs[i - 1], 1e-9)
    if len(xs) == 1:
        return ys[0]
    return ys[-1] + (x - xs[-1]) * (ys[-1] - ys[-2]) / max(xs[-1] - xs[-2], 1e-9)


def _linfit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    if len(xs) < 2 or len(set(xs)) < 2:
        return (statistics.fmean(ys) if ys else 0.05), 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    b = max(b, 0.0)
    return max(my - b * mx, 1e-4), b


def load_traces(folders: list[str | Path]) -> tuple[list[dict], list[dict], dict]:
    rounds, runs, meta = [], [], {}
    for f in folders:
        f = Path(f)
        rounds += read_jsonl(f / "rounds.jsonl")
        runs += read_jsonl(f / "runs.jsonl")
        if (f / "meta.json").exists() and not meta:
            meta = json.loads((f / "meta.json").read_text())
    return rounds, runs, meta


def calibrate(rounds: list[dict], runs: list[dict], meta: dict, gpu_profile: str | None = None,
              seed: int = 0) -> Calibration:
    cfg = meta.get("config", {})
    profiles = meta.get("profiles", {})
    scheds = meta.get("schedules", {})
    free, busy, busy_int = [], [], []
    for r in rounds:
        if r.get("draft_steps", 0) > 0 and r.get("draft_s", 0) > 0:
            s = r["draft_s"] / r["draft_steps"]
            if r.get("load", 0.0) > 0.5 * _sched_intensity(scheds, r.get("schedule")):
                busy.append(s)
                busy_int.append(_sched_intensity(scheds, r.get("schedule")))
            elif r.get("load", 0.0) == 0.0:
                free.append(s)
    cal = Calibration(step_s=free or [0.05], depth=int(cfg.get("depth", 4)), budget=int(cfg.get("budget", 8)),
                      tokens_per_step=float(cfg.get("width", 2)))
    if free and busy:
        cal.slowdown = max(1.0, statistics.median(busy) / statistics.median(free))
        cal.cal_intensity = statistics.median(busy_int)
    vx = [r["tree_nodes"] for r in rounds if r.get("verify_s", 0) > 0]
    vy = [r["verify_s"] for r in rounds if r.get("verify_s", 0) > 0]
    if vx:
        cal.verify_a, cal.verify_b = _linfit(vx, vy)
    if gpu_profile:
        g = json.loads(Path(gpu_profile).read_text())
        pairs = sorted(zip(g["nodes"], g["seconds"], strict=True))
        cal.gpu_profile = ([float(a) for a, _ in pairs], [float(b) for _, b in pairs])
    ov = [r["cloud_s"] - r["verify_s"] - profiles.get(r.get("profile"), {}).get("rtt_ms", 0.0) / 1000
          for r in rounds if r.get("cloud_s", 0) > 0]
    if ov:
        cal.overhead_s = max(0.0, statistics.median(ov))
    st = []
    by_run = _group_runs(rounds)
    for r in runs:
        rs = by_run.get(_run_key(r), [])
        if rs:
            st.append(max(0.0, r["wall_s"] - sum(x["t_end"] - x["t_start"] for x in rs)))
    if st:
        cal.startup_s = statistics.median(st)
    nd: dict[int, list[int]] = defaultdict(list)
    for r in rounds:
        if r.get("depth", 0) > 0 and r.get("tree_nodes", 0) > 0:
            nd[r["depth"]].append(r["tree_nodes"])
    cal.nodes_by_depth = {d: statistics.median(v) for d, v in nd.items()}
    # acceptance: per-position match string
    ones = sum(min(r["accepted"], r["depth"]) for r in rounds if r.get("depth", 0) > 0)
    zeros = sum(1 for r in rounds if r.get("depth", 0) > 0 and r["accepted"] < r["depth"])
    cal.p_accept = ones / max(ones + zeros, 1) if ones + zeros else 0.6
    rng = random.Random(seed)
    bits: list[int] = []
    for rs in by_run.values():
        for r in sorted(rs, key=lambda x: x["round"]):
            if r.get("depth", 0) <= 0:
                continue
            a = min(r["accepted"], r["depth"])
            bits += [1] * a
            bits.append(0 if a < r["depth"] else int(rng.random() < cal.p_accept))
    cal.match_bits = bits or [1, 1, 0]
    full = [bool(r["proactive_hit"]) for r in rounds
            if r.get("proactive_hit") is not None and r["accepted"] >= r["depth"]]
    part = [bool(r["proactive_hit"]) for r in rounds
            if r.get("proactive_hit") is not None and r["accepted"] < r["depth"]]
    allh = full + part
    base = sum(allh) / len(allh) if allh else 0.3
    cal.p_hit_full = sum(full) / len(full) if len(full) >= 3 else base
    cal.p_hit_part = sum(part) / len(part) if len(part) >= 3 else base
    cal.source = ", ".join(sorted({str(r.get("profile")) for r in runs}))
    return cal


def _sched_intensity(scheds: dict, name: str | None) -> float:
    d = scheds.get(name or "none")
    return float(d["intensity"]) if d and d.get("kind") != "none" else 1.0


def _run_key(r: dict) -> tuple:
    return (r.get("profile"), r.get("schedule"), r.get("set"), r.get("prompt_id"), r.get("repeat"), r.get("policy"))


def _group_runs(rounds: list[dict]) -> dict[tuple, list[dict]]:
    g: dict[tuple, list[dict]] = defaultdict(list)
    for r in rounds:
        g[_run_key(r)].append(r)
    return g
