"""``rapid sim``: a discrete-event model of RAPID rounds, calibrated from ``rapid bench`` traces.

Model (one edge; N edges share one cloud in the scale study):
- edge step time = a sample of the measured uncontended per-step times × the contention
  slowdown while the schedule is active (slowdown measured from the contended rounds);
- cloud response = up-link delay + queueing + verify(nodes) + down-link delay, verify(nodes)
  a least-squares line fitted to the traced ``verify_s`` (or a GPU profile JSON, seconds vs
  nodes), the RTT drawn from the network profile, plus the measured transport overhead;
- acceptance replayed from the traces as a per-position match string (a round that accepted a
  of L gives a ones and, if a < L, a zero; a fully accepted round's next bit is drawn with the
  traced per-token acceptance); proactive hits drawn per position with the traced hit rates
  (separately for fully and partly accepted rounds).

The SAME policy code decides: the policy flags are the ``rapid.runtime.policies.POLICIES``
objects, and the depth controller is the one ``rapid.runtime.coordinator.Coordinator`` builds
(``CAAC`` / ``FixedDepth`` of ``rapid.runtime.caac``), fed through ``observe_step`` /
``observe_round`` / ``next_depth`` in the coordinator's order.

The oracle knows the future match string, the hits and the contention: it drafts exactly the
tokens that will be accepted (or nothing when drafting costs more than it saves), expands a
proactive branch only when it will be kept, and stops it the moment the verdict lands.
"""

from __future__ import annotations

import heapq
import json
import math
import random
import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from rapid.bench.contention import Schedule, parse_schedule
from rapid.bench.netem import NetProfile, get_profile
from rapid.bench.report import read_jsonl
from rapid.runtime.coordinator import Coordinator, CoordinatorConfig
from rapid.runtime.policies import POLICIES, Policy

ORACLE = "oracle"


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


# ---------------------------------------------------------------------------------------------
# the discrete-event model
@dataclass(slots=True)
class EdgeResult:
    tokens: int = 0
    rounds: int = 0
    wall_s: float = 0.0
    accepted: int = 0
    interrupts: int = 0
    hits: int = 0
    branches: int = 0
    draft_steps: int = 0
    discarded: int = 0
    depths: list[int] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


class _Edge:
    def __init__(self, idx: int, policy: Policy | str, cal: Calibration, sched: Schedule, prof: NetProfile,
                 tokens: int, seed: int, phase: float, startup: bool, config: CoordinatorConfig) -> None:
        self.idx = idx
        self.oracle = policy == ORACLE
        self.policy = POLICIES["rapid"] if self.oracle else policy
        # the controller exactly as the runtime's coordinator builds it
        self.ctrl = Coordinator(None, None, self.policy, config).controller  # type: ignore[arg-type]
        self.cal, self.sched, self.prof = cal, sched, prof
        self.target = tokens
        self.rng = random.Random(seed * 1_000_003 + idx)
        self.phase = phase
        n = len(cal.match_bits)
        self.offset = (seed * 7919 + idx * 104729) % n
        hr = random.Random(seed * 31 + idx)
        self.u_hit = [hr.random() for _ in range(tokens + 16)]
        self.res = EdgeResult()
        self.pos = 0
        self.reused = 0
        self.t0 = 0.0
        self.startup = cal.startup_s if startup else 0.0
        self.decision = None

    # -- model pieces
    def bit(self, p: int) -> int:
        bits = self.cal.match_bits
        return bits[(self.offset + p) % len(bits)]

    def run_len(self, p: int, cap: int) -> int:
        k = 0
        while k < cap and self.bit(p + k):
            k += 1
        return k

    def factor(self, t: float) -> float:
        s = self.sched
        if not s.active(t - self.t0 + self.phase):
            return 1.0
        return 1.0 + (self.cal.slowdown - 1.0) * s.intensity / max(self.cal.cal_intensity, 1e-9)

    def step_time(self, t: float) -> float:
        return self.rng.choice(self.cal.step_s) * self.factor(t)

    def mean_step(self, t: float) -> float:
        return statistics.median(self.cal.step_s) * self.factor(t)

    def hit(self, pos_end: int, full: bool) -> bool:
        p = self.cal.p_hit_full if full else self.cal.p_hit_part
        return self.u_hit[min(pos_end, len(self.u_hit) - 1)] < p

    def oracle_depth(self, t: float) -> int:
        maxd = self.ctrl.config.max_depth
        r = self.run_len(self.pos, min(maxd, self.target - self.pos))
        if r == 0:
            return 0
        s = self.mean_step(t)
        rtt = self.prof.rtt_ms / 1000 + self.cal.overhead_s
        free = min(self.reused, r)
        t_draft = (r - free) * s + self.cal.verify(self.cal.nodes(r)) + rtt
        t_none = self.cal.verify(0) + rtt
        return r if t_draft / (r + 1) < t_none else 0


def simulate(policy: Policy | str, cal: Calibration, sched: Schedule, prof: NetProfile, tokens: int = 256,
             seed: int = 0, edges: int = 1, max_batch: int = 64, startup: bool = True,
             config: CoordinatorConfig | None = None) -> dict:
    """Run ``edges`` edges until each has ``tokens`` tokens; returns per-edge results and cloud stats."""
    config = config or CoordinatorConfig(depth=cal.depth)
    rng = random.Random(seed)
    period = (sched.on_s + sched.off_s) if sched.kind == "burst" else 0.0
    es = [_Edge(i, policy, cal, sched, prof, tokens, seed, rng.random() * period if edges > 1 else 0.0,
                startup, config) for i in range(edges)]
    events: list = []  # (time, seq, kind, edge, payload)
    seq = 0

    def push(t, kind, e, payload=None):
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, e, payload))
        seq += 1

    queue: list = []  # (edge, nodes, t_send)
    cloud_busy_until = 0.0
    cloud_busy = 0.0
    batches: list[int] = []
    for e in es:
        push(e.startup, "round", e.idx)
    now = 0.0
    pending: dict[int, dict] = {}

    def start_batch(t):
        nonlocal cloud_busy_until, cloud_busy
        if not queue or cloud_busy_until > t:
            return
        batch, rest = queue[:max_batch], queue[max_batch:]
        queue[:] = rest
        total = sum(n for _, n in batch)
        dur = cal.verify(total) if len(batch) > 1 else cal.verify(batch[0][1])
        cloud_busy_until = t + dur
        cloud_busy += dur
        batches.append(len(batch))
        for idx, _ in batch:
            pending[idx]["verify_s"] = dur
            down = es[idx].prof.sample_rtt_s(es[idx].rng) / 2 + cal.overhead_s
            push(t + dur + down, "verdict", idx)
        push(t + dur, "cloud_free", -1)

    while events:
        now, _, kind, idx, payload = heapq.heappop(events)
        if kind == "cloud_free":
            start_batch(now)
            continue
        if kind == "arrive":
            queue.append((idx, payload))
            start_batch(now)
            continue
        e = es[idx]
        if kind == "round":  # decide, draft, send
            if e.decision is None:
                e.decision = e.ctrl.next_depth(e.policy.proactive)
            if e.oracle:
                depth = e.oracle_depth(now)
            elif not e.policy.drafting:
                depth = 0
            else:
                depth = max(1, min(e.decision.depth, e.target - e.pos))
            t = now
            steps = max(0, depth - e.reused) if depth > 0 else 0
            for _ in range(steps):
                d = e.step_time(t)
                t += d
                e.ctrl.observe_step(d, max(1, round(e.cal.tokens_per_step)))
            e.res.draft_steps += steps
            nodes = e.cal.nodes(depth)
            up = e.prof.sample_rtt_s(e.rng) / 2
            pending[idx] = {"depth": depth, "t_send": t, "t_start": now}
            push(t + up, "arrive", idx, nodes)
            continue
        if kind == "verdict":
            p = pending.pop(idx)
            depth, t_send, t_arr = p["depth"], p["t_send"], now
            a = e.run_len(e.pos, depth) if depth > 0 else 0
            full = depth > 0 and a >= depth
            hit = e.hit(e.pos + a, full)
            end = t_arr
            e.reused = 0
            pol = e.policy
            next_dec = None
            if pol.proactive and pol.drafting and (not e.oracle or (hit and depth > 0)):
                if not e.oracle:
                    next_dec = e.ctrl.next_depth(True)
                    want = next_dec.depth
                else:
                    want = e.ctrl.config.max_depth
                t, steps, stopped = t_send, 0, None
                while steps < want:
                    if pol.interruptible and t >= t_arr:
                        break
                    d = e.step_time(t)
                    t += d
                    steps += 1
                    e.ctrl.observe_step(d, max(1, round(e.cal.tokens_per_step)))
                    if pol.interruptible and t >= t_arr:
                        stopped = steps
                        break
                end = max(t_arr, t)
                e.res.branches += 1
                e.res.interrupts += stopped is not None
                if hit:
                    e.res.hits += 1
                    e.reused = steps
                else:
                    e.res.discarded += steps
                e.res.draft_steps += steps
            e.ctrl.observe_round(a, max(depth, 1), t_arr - t_send)
            e.decision = next_dec if next_dec is not None else e.ctrl.next_depth(pol.proactive)
            e.pos += a + 1
            e.res.tokens = min(e.pos, e.target)
            e.res.rounds += 1
            e.res.accepted += a
            e.res.depths.append(depth)
            if e.pos >= e.target:
                e.res.wall_s = end
            else:
                push(end, "round", idx)
    horizon = max(e.res.wall_s for e in es)
    return {"edges": [e.res for e in es], "cloud_util": cloud_busy / horizon if horizon > 0 else 0.0,
            "mean_batch": statistics.fmean(batches) if batches else 0.0, "horizon_s": horizon}


def sim_tok_s(policy, cal, sched, prof, tokens, seeds, **kw) -> float:
    return statistics.fmean(
        statistics.fmean(r.tok_s for r in simulate(policy, cal, sched, prof, tokens, s, **kw)["edges"])
        for s in range(seeds))


# ---------------------------------------------------------------------------------------------
# the CLI
def run_sim_cli(a) -> int:
    from rapid.bench.report import aggregate

    rounds, runs, meta = load_traces(a.traces)
    if not runs:
        raise SystemExit(f"rapid sim: no runs.jsonl in {a.traces}")
    out = Path(a.out or Path(a.traces[0]) / "sim")
    out.mkdir(parents=True, exist_ok=True)
    cal = calibrate(rounds, runs, meta, a.gpu_profile)
    traced_pols = sorted({r["policy"] for r in runs})
    pols = [p.strip() for p in a.policies.split(",")] if a.policies else sorted(
        set(traced_pols) | {"fixed", "npdg", "ipdg", "caac", "rapid"})
    scheds = [s.strip() for s in a.contention.split(",")] if a.contention else sorted({r["schedule"] for r in runs})
    profs = [p.strip() for p in a.profiles.split(",")] if a.profiles else sorted({r["profile"] for r in runs})
    max_new = int(meta.get("config", {}).get("max_new", 24))
    sched_of = {n: Schedule(**d) for n, d in meta.get("schedules", {}).items()}

    def sch(n):
        return sched_of.get(n) or parse_schedule(n)

    # 1. validation on the settings that were run for real
    measured = {(r["profile"], r["schedule"], r["policy"]): r["tok_s"] for r in aggregate(runs)}
    val = []
    for (prof, sname, pol), m in sorted(measured.items()):
        if pol not in POLICIES:
            continue
        s = sim_tok_s(POLICIES[pol], cal, sch(sname), get_profile(prof), max_new, max(a.seeds, 20))
        val.append({"profile": prof, "schedule": sname, "policy": pol, "measured_tok_s": m, "sim_tok_s": s,
                    "error": (s - m) / m if m else float("nan")})
    # 2. policies vs the oracle (long generations, no start-up)
    cells = []
    for prof in profs:
        for sname in scheds:
            orc = sim_tok_s(ORACLE, cal, sch(sname), get_profile(prof), a.tokens, a.seeds, startup=False)
            for pol in pols:
                s = sim_tok_s(POLICIES[pol], cal, sch(sname), get_profile(prof), a.tokens, a.seeds, startup=False)
                cells.append({"profile": prof, "schedule": sname, "policy": pol, "sim_tok_s": s,
                              "oracle_tok_s": orc, "of_oracle": s / orc if orc else float("nan")})
    # 3. many edges, one batched verifier
    scale = []
    ns = [int(x) for x in a.edges.split(",") if x.strip()]
    sname = next((s for s in scheds if s != "none"), scheds[0])
    for pol in [p for p in ("fixed", "rapid") if p in pols] or pols[:2]:
        for n in ns:
            r = simulate(POLICIES[pol], cal, sch(sname), get_profile(profs[0]), min(a.tokens, 64), 0, edges=n,
                         max_batch=a.max_batch, startup=False)
            tps = [e.tok_s for e in r["edges"]]
            scale.append({"policy": pol, "edges": n, "schedule": sname, "tok_s_per_edge": statistics.fmean(tps),
                          "total_tok_s": sum(tps), "cloud_util": r["cloud_util"], "mean_batch": r["mean_batch"]})
    result = {"calibration": cal.to_json(), "validation": val, "policies": cells, "scale": scale,
              "tokens": a.tokens, "seeds": a.seeds, "traces": [str(t) for t in a.traces]}
    (out / "sim.json").write_text(json.dumps(result, indent=2))
    _write_sim_md(out, result)
    _plot_scale(out, scale)
    print((out / "sim.md").read_text())
    return 0


def _write_sim_md(out: Path, res: dict) -> None:
    c = res["calibration"]
    L = ["# rapid sim report", "",
         f"- calibrated from {res['traces']}" + (" + GPU profile" if c.get("gpu_profile") else ""),
         f"- edge step (uncontended median) {c['step_s_median']:.4g} s over {c['step_samples']} rounds; contention "
         f"slowdown ×{c['slowdown']:.2f} at intensity {c['cal_intensity']:g}",
         f"- verify(nodes) = {c['verify_a']:.4g} + {c['verify_b']:.4g}·nodes s; transport overhead "
         f"{c['overhead_s'] * 1000:.1f} ms/round; start-up {c['startup_s']:.2f} s/generation",
         f"- acceptance replay: {c['match_bits']} positions, per-token acceptance {c['p_accept']:.2f}; proactive hit "
         f"rate {c['p_hit_full']:.2f} (fully accepted) / {c['p_hit_part']:.2f} (partly)",
         "- policies: the runtime's `POLICIES` objects and the controller `Coordinator` builds (CAAC/FixedDepth)",
         "", "## Validation: simulated vs measured throughput (same settings, same tokens per generation)", "",
         "| profile | schedule | policy | measured tok/s | simulated tok/s | error |", "|---|---|---|---|---|---|"]
    for v in res["validation"]:
        L.append(f"| {v['profile']} | {v['schedule']} | {v['policy']} | {v['measured_tok_s']:.3g} | "
                 f"{v['sim_tok_s']:.3g} | {v['error']:+.1%} |")
    errs = [abs(v["error"]) for v in res["validation"] if not math.isnan(v["error"])]
    if errs:
        L.append(f"\nmean |error| {statistics.fmean(errs):.1%}, max {max(errs):.1%} (target ≤ 15 %)")
    L += ["", f"## Policies vs the oracle ({res['tokens']} tokens, {res['seeds']} seeds, no start-up)", "",
          "| profile | schedule | policy | tok/s | oracle tok/s | fraction of oracle |", "|---|---|---|---|---|---|"]
    for r in res["policies"]:
        L.append(f"| {r['profile']} | {r['schedule']} | {r['policy']} | {r['sim_tok_s']:.3g} | "
                 f"{r['oracle_tok_s']:.3g} | {r['of_oracle']:.0%} |")
    L += ["", "## Many edges, one batched verifier (batch time = verify(total nodes))", "",
          "| policy | schedule | edges | tok/s per edge | total tok/s | cloud utilisation | mean batch |",
          "|---|---|---|---|---|---|---|"]
    for r in res["scale"]:
        L.append(f"| {r['policy']} | {r['schedule']} | {r['edges']} | {r['tok_s_per_edge']:.3g} | "
                 f"{r['total_tok_s']:.3g} | {r['cloud_util']:.0%} | {r['mean_batch']:.1f} |")
    L += ["", "![scale](scale.png)", ""]
    (out / "sim.md").write_text("\n".join(L), encoding="utf-8")


def _plot_scale(out: Path, scale: list[dict]) -> None:
    if not scale:
        return
    from rapid.bench.plots import _plt

    plt = _plt()
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
    for pol in sorted({r["policy"] for r in scale}):
        rs = [r for r in scale if r["policy"] == pol]
        ax[0].plot([r["edges"] for r in rs], [r["tok_s_per_edge"] for r in rs], marker="o", label=pol)
        ax[1].plot([r["edges"] for r in rs], [r["cloud_util"] for r in rs], marker="o", label=pol)
    for x, yl in zip(ax, ("tok/s per edge", "cloud utilisation"), strict=True):
        x.set_xscale("log", base=2)
        x.set_xlabel("edges")
        x.set_ylabel(yl)
        x.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "scale.png", dpi=90)
    plt.close(fig)
