"""Calibration of ``rapid sim`` from ``rapid bench`` traces (or a GPU verify-time profile):
edge step time and contention slowdown, verify time vs tree size, transport overhead, start-up,
acceptance replay. Pure data in, a ``Calibration`` out."""

from __future__ import annotations

import random
import statistics
from collections import defaultdict
from dataclasses import asdict, dataclass, field

from rapid.bench.beside_fit import BesideFit, fit_beside
from rapid.bench.colocation import fit_colocation, verify_alone
from rapid.bench.edgellm_fit import fit_branch_steps, fit_chain_step, fit_confidence_cut
from rapid.bench.gpu_profile import load_gpu_profile
from rapid.bench.positions import bits_by_position, chains_by_position, rounds_at, sent_levels
from rapid.bench.round_replay import RoundReplay, TracedRound
from rapid.bench.step_fit import fit_steps
from rapid.bench.traces import group_runs, run_key, with_previous
from rapid.runtime.cost_model import interpolate_sorted
from rapid.runtime.tree import AUTO_BUDGET_CAP


# ---------------------------------------------------------------------------------------------
# calibration
@dataclass(slots=True)
class Calibration:
    step_s: list[float]  # uncontended per-step seconds (samples)
    step_reference: str = "uncontended rounds"  # where step_s came from (see calibrate)
    slowdown: float = 2.0  # contended / uncontended median step time at intensity cal_intensity
    cal_intensity: float = 1.0
    # per traced schedule (name): the slowdown of steps in rounds that ran wholly in its load, and
    # wholly out of it (rapid.bench.step_fit)
    slowdown_by_schedule: dict[str, float] = field(default_factory=dict)
    idle_slowdown_by_schedule: dict[str, float] = field(default_factory=dict)
    verify_a: float = 0.05  # verify seconds = verify_a + verify_b * nodes (batch: total nodes)
    verify_b: float = 0.005
    gpu_profile: tuple[list[float], list[float]] | None = None  # (nodes, seconds), interpolated
    # draft step cost by tokens per step (relative), interpolated; None: linear in tokens (this CPU, fp32)
    step_curve: tuple[list[float], list[float]] | None = None
    verify_table: tuple[list[float], list[float]] | None = None  # traced medians by node count, interpolated
    overhead_s: float = 0.002  # transport/framing per round, beyond verify and the profile RTT
    # the one host's co-location tax on the verify (rapid.bench.colocation): per traced schedule
    # (in its load, out of it) × the verify alone, else × (1 + load_tax) in a load; + step_tax s per
    # s of edge step beside an unloaded verify; none of it for a cloud elsewhere
    verify_by_schedule: dict[str, tuple[float, float]] = field(default_factory=dict)
    load_tax: float = 0.0
    step_tax: float = 0.0
    startup_s: float = 0.0  # per generation: connect + cloud prefill (wall - sum of rounds)
    prefill_s: float = 0.0  # draft prefill inside the first round (uncontended; contention scales it)
    draft_ahead: bool = False  # round 0's tree was drafted while the cloud prefilled (traces with ahead_s)
    warm_controller: bool = False  # the traced runs carried a warmed-up controller across generations
    cut_continue: tuple[float, float] | None = None  # EdgeLLM confidence cut: P(continue | miss, match)
    tokens_per_step: float = 2.0
    # a one-token (chain) step's time relative to a tree step, where a non-interruptible chain
    # branch was traced (its steps then set the wait); None: tokens / tokens_per_step
    chain_step: float | None = None
    # per non-interruptible proactive policy: mean branch steps a round ran (they all run)
    branch_steps_by_policy: dict[str, float] = field(default_factory=dict)
    match_bits: list[int] = field(default_factory=lambda: [1, 1, 0])
    # aligned with match_bits: levels a prompt-lookup chain offers a round that starts there
    # (a traced round whose sent tree reached deeper than its drafted levels), 0 elsewhere
    lookup_reach: list[int] = field(default_factory=list)
    # where each traced generation starts in match_bits (its position 0) and its rounds
    # (rapid.bench.round_replay); a simulated generation starts at one of its policy's, none: anywhere
    replay: RoundReplay = field(default_factory=RoundReplay)
    # per policy: median levels of the sent tree by drafted levels, lookup rounds left out (the
    # send cut keeps fewer levels than were drafted where deep nodes do not pay)
    levels_by_policy: dict[str, dict[int, float]] = field(default_factory=dict)
    # per policy: mean draft steps a round ran by the levels it planned to draft (depth - reused):
    # level 1 is often free (the root's next token is known from the verdict) and a tree whose
    # frontier falls below the score floor stops early
    steps_by_policy: dict[str, dict[int, float]] = field(default_factory=dict)
    # per policy: mean levels a kept branch supplied by the steps it ran (a tree branch's roots
    # share the steps: 3 steps gave 1.6-2.0 levels on a Zen 3, not 3)
    reused_by_policy: dict[str, dict[int, float]] = field(default_factory=dict)
    p_accept: float = 0.6  # per-token acceptance (for censored rounds)
    p_hit_full: float = 0.5  # proactive hit rate after a fully accepted round
    p_hit_part: float = 0.3  # ... after a partly accepted round
    hits_by_policy: dict[str, tuple[float, float]] = field(default_factory=dict)  # (full, part) where traced
    depth: int = 4
    nodes_by_depth: dict[int, float] = field(default_factory=dict)
    # per policy: median tree nodes by the levels actually in the tree (a cut tree is shallower
    # than planned; a kept chain branch adds one node per level)
    nodes_by_policy: dict[str, dict[int, float]] = field(default_factory=dict)
    budget: int = 8
    beside: BesideFit = field(default_factory=BesideFit)  # steps beside the verify (rapid.bench.beside_fit)
    min_p: float = 0.0  # the traced --min-p: a tree keeps no lookup node whose path probability is below it
    source: str = ""

    def verify(self, nodes: float) -> float:
        if self.gpu_profile is not None:
            xs, ys = self.gpu_profile
            return interpolate_sorted(nodes, xs, ys)
        if self.verify_table is not None:  # the measured curve (CPU verify is concave in nodes)
            xs, ys = self.verify_table
            return max(1e-4, interpolate_sorted(nodes, xs, ys))
        return max(1e-4, self.verify_a + self.verify_b * nodes)

    def cloud_elsewhere(self) -> None:
        """The cloud on its own machine (a GPU profile, a preset): no co-location tax."""
        self.verify_by_schedule, self.load_tax, self.step_tax = {}, 0.0, 0.0
        self.beside.colocated = False  # a step beside the verify shares no memory with it (its tokens stay)

    @property
    def step_tokens(self) -> int:
        """Tokens one tree expansion step feeds (the tree's width; at least 1)."""
        return max(1, round(self.tokens_per_step))

    def step_curve_at(self, tokens: float) -> float:
        """The step curve at ``tokens`` tokens per step (``tokens`` itself without a curve)."""
        if self.step_curve is None:
            return float(tokens)
        return interpolate_sorted(tokens, *self.step_curve)

    def step_scale(self, tokens: float) -> float:
        """Time of a draft step feeding ``tokens`` tokens relative to a tree step (``step_s``
        samples, ``step_tokens`` tokens): curve(tokens) / curve(step_tokens); without a curve
        tokens / step_tokens (cost linear in tokens, as traced on this CPU in fp32)."""
        if self.step_curve is None:
            if self.chain_step is not None and tokens < self.step_tokens:
                return interpolate_sorted(tokens, [1.0, float(self.step_tokens)], [self.chain_step, 1.0])
            return tokens / self.step_tokens
        return self.step_curve_at(tokens) / self.step_curve_at(self.step_tokens)

    def nodes(self, depth: int, policy: str | None = None) -> float:
        if depth <= 0:
            return 0.0
        if depth in self.nodes_by_policy.get(policy or "", {}):
            return self.nodes_by_policy[policy][depth]
        if depth in self.nodes_by_depth:
            return self.nodes_by_depth[depth]
        return float(min(self.budget, 2 * depth))

    def levels(self, depth: int, policy: str | None = None) -> int:
        """Levels of the tree sent after drafting ``depth`` (the send cut may drop the deepest)."""
        return max(1, round(self.levels_by_policy.get(policy or "", {}).get(depth, depth))) if depth > 0 else 0

    def steps(self, planned: int, policy: str | None = None) -> float:
        """Mean draft steps a round runs to draft ``planned`` levels (``planned`` where untraced)."""
        return self.steps_by_policy.get(policy or "", {}).get(planned, float(planned)) if planned > 0 else 0.0

    def reused(self, steps: int, levels: int, policy: str | None = None) -> float:
        """Mean levels a kept branch of ``steps`` steps supplies (``levels`` at most; ``steps``
        where untraced)."""
        return min(float(levels), self.reused_by_policy.get(policy or "", {}).get(steps, float(steps)))

    def steps_for(self, levels: int, policy: str | None = None) -> int:
        """Branch steps to supply ``levels`` levels: the fewest ``s`` with ``reused(s) >= levels``.
        The runtime's branch runs until its best root has the levels it aims at
        (``Coordinator._branch``), and a root of the second wave gets its first level from the
        branch's second step, so a traced policy needs more steps than levels."""
        traced = self.reused_by_policy.get(policy or "", {})
        bound = max(levels, max(traced, default=0)) + 1
        return next((s for s in range(bound) if self.reused(s, levels, policy) >= levels), bound)

    def reach(self, p: int) -> int:
        """Levels a prompt-lookup chain offers at replay position ``p`` (0: none)."""
        return self.lookup_reach[p % len(self.lookup_reach)] if self.lookup_reach else 0

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in self.__slots__
             if k not in ("step_s", "match_bits", "lookup_reach", "replay", "levels_by_policy",
                          "steps_by_policy", "reused_by_policy")}
        d["step_s_median"] = statistics.median(self.step_s) if self.step_s else None
        d["step_samples"] = len(self.step_s)
        d["match_bits"] = len(self.match_bits)
        d["nodes_by_depth"] = {str(k): v for k, v in self.nodes_by_depth.items()}
        d["nodes_by_policy"] = {p: {str(k): v for k, v in t.items()} for p, t in self.nodes_by_policy.items()}
        d["beside"] = asdict(self.beside)
        return d


def _linfit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    if len(xs) < 2 or len(set(xs)) < 2:
        return (statistics.fmean(ys) if ys else 0.05), 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    b = max(b, 0.0)
    return max(my - b * mx, 1e-4), b


def calibrate(rounds: list[dict], runs: list[dict], meta: dict, gpu_profile: str | None = None,
              seed: int = 0) -> Calibration:
    cfg = meta.get("config", {})
    profiles = meta.get("profiles", {})
    steps = fit_steps(rounds, meta)
    cal = Calibration(step_s=steps.step_s, step_reference=steps.reference, slowdown=steps.slowdown,
                      cal_intensity=steps.cal_intensity, slowdown_by_schedule=steps.slowdown_by_schedule,
                      idle_slowdown_by_schedule=steps.idle_slowdown_by_schedule, depth=int(cfg.get("depth", 4)),
                      budget=_traced_budget(cfg), tokens_per_step=float(cfg.get("width", 2)),
                      min_p=float(cfg.get("min_p") or 0.0))
    cal.chain_step = fit_chain_step(rounds)
    cal.beside = fit_beside(rounds, cal.step_s)
    fit_cloud(cal, rounds, profiles, meta.get("schedules", {}))
    if gpu_profile:  # a cloud on its own machine: no co-location tax
        cal.gpu_profile = load_gpu_profile(gpu_profile)
        cal.cloud_elsewhere()
    by_run = group_runs(rounds)
    cal.startup_s = _startup(runs, by_run)
    nd: dict[int, list[int]] = defaultdict(list)
    for r in rounds:
        if r.get("depth", 0) > 0 and r.get("tree_nodes", 0) > 0:
            nd[r["depth"]].append(r["tree_nodes"])
    cal.nodes_by_depth = {d: statistics.median(v) for d, v in nd.items()}
    cal.nodes_by_policy = _nodes_by_policy(by_run)
    fit_acceptance(cal, rounds, seed)
    cal.prefill_s = _prefill(rounds, by_run)
    cal.draft_ahead = any("ahead_s" in r for r in rounds)
    cal.warm_controller = str(meta.get("controller", "")).startswith("carried")
    cal.cut_continue = fit_confidence_cut(rounds)
    cal.branch_steps_by_policy = fit_branch_steps(rounds)
    cal.reused_by_policy = _per_policy(((r, r.get("proactive_steps", 0), r.get("reused_depth", 0)) for r in rounds
                                        if r.get("proactive_hit") and r.get("proactive_steps")), statistics.fmean)
    cal.source = ", ".join(sorted({str(r.get("profile")) for r in runs}))
    return cal


def fit_cloud(cal: Calibration, rounds: list[dict], profiles: dict, schedules: dict | None = None) -> Calibration:
    """Refit the cloud side from ``rounds``: verify time by tree nodes (least-squares line and
    the medians per node count) from the rounds whose verify ran with the edge idle (the
    schedule-free cells' where they give a curve), the co-location tax against it
    (``rapid.bench.colocation``; ``schedules``: meta's), and the transport overhead beyond the
    profile's RTT. Traces with no such curve: the curve of every round, and no tax."""
    alone = [r for r in rounds if verify_alone(r)]
    idle = [r for r in alone if str(r.get("schedule", "none")) == "none"]
    taxed = _verify_curve(cal, idle) or _verify_curve(cal, alone)  # the first that gives a curve
    if not taxed:
        _verify_curve(cal, [r for r in rounds if r.get("verify_s", 0) > 0])
    fit = fit_colocation(rounds, cal.verify, schedules or {}) if taxed else None
    cal.verify_by_schedule = fit.verify_by_schedule if fit else {}
    cal.load_tax, cal.step_tax = (fit.load_tax, fit.step_tax) if fit else (0.0, 0.0)
    ov = [r["cloud_s"] - r["verify_s"] - profiles.get(r.get("profile"), {}).get("rtt_ms", 0.0) / 1000
          for r in rounds if r.get("cloud_s", 0) > 0]
    if ov:
        cal.overhead_s = max(0.0, statistics.median(ov))
    return cal


def _verify_curve(cal: Calibration, rounds: list[dict]) -> bool:
    """``cal``'s verify line and medians by node count (3 rounds each) from ``rounds``; whether
    they give a curve (2 node counts)."""
    cal.verify_table = None
    if not rounds:
        return False
    cal.verify_a, cal.verify_b = _linfit([r["tree_nodes"] for r in rounds], [r["verify_s"] for r in rounds])
    by_n: dict[float, list[float]] = defaultdict(list)
    for r in rounds:
        by_n[r["tree_nodes"]].append(r["verify_s"])
    pts = sorted((x, statistics.median(ys)) for x, ys in by_n.items() if len(ys) >= 3)
    cal.verify_table = ([float(x) for x, _ in pts], [y for _, y in pts]) if len(pts) >= 2 else None
    return cal.verify_table is not None


def fit_prompt_set(cal: Calibration, rounds: list[dict], runs: list[dict], seed: int = 0) -> Calibration:
    """Refit what depends on the prompts from one prompt set's traces: the acceptance replay,
    the start-up (cloud prefill), the draft prefill (both grow with the prompt's length) and the
    steps a non-interruptible branch runs;
    the device and network timing stays; returns ``cal``."""
    by_run = group_runs(rounds)
    fit_acceptance(cal, rounds, seed)
    cal.startup_s = _startup(runs, by_run) if runs else cal.startup_s
    cal.prefill_s = _prefill(rounds, by_run) or cal.prefill_s
    # a non-interruptible branch's steps depend on the prompt's trees (npdg: ~4.5 on c4, ~7 on wikitext)
    cal.branch_steps_by_policy = {**cal.branch_steps_by_policy, **fit_branch_steps(rounds)}
    return cal


def _nodes_by_policy(by_run: dict[tuple, list[dict]]) -> dict[str, dict[int, float]]:
    """Median tree nodes by levels in the tree (drafted steps + levels kept from the branch)."""
    return _per_policy(((r, r.get("draft_steps", 0) + kept, r["tree_nodes"]) for r, kept in _in_order(by_run)
                        if r.get("draft_steps", 0) + kept > 0 and r.get("tree_nodes", 0) > 0), statistics.median)


def _in_order(by_run: dict[tuple, list[dict]]):
    """Every run's rounds in order, each with the levels the previous round's kept branch supplied."""
    for r, prev in with_previous(by_run):
        yield r, 0 if prev is None else prev.get("reused_depth", 0)


def _per_policy(samples, agg) -> dict[str, dict[int, float]]:
    """``agg`` of the values per policy and key, from (round, key, value) samples; keys with at
    least 3 samples."""
    acc: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r, key, value in samples:
        acc[str(r.get("policy"))][key].append(value)
    return {p: {k: agg(v) for k, v in t.items() if len(v) >= 3} for p, t in acc.items()}


def _startup(runs: list[dict], by_run: dict[tuple, list[dict]]) -> float:
    """Median per-generation time outside the rounds: connect + the cloud's prompt prefill."""
    st = [max(0.0, r["wall_s"] - sum(x["t_end"] - x["t_start"] for x in by_run[run_key(r)]))
          for r in runs if by_run.get(run_key(r))]
    return statistics.median(st) if st else 0.0


def fit_acceptance(cal: Calibration, rounds: list[dict], seed: int = 0) -> Calibration:
    """Replace ``cal``'s acceptance replay (match string, lookup reach, per-token acceptance, sent
    levels, hit rates) by the one of ``rounds`` (e.g. one prompt set's), keeping the timing model;
    returns ``cal``.

    A round that accepted ``a`` of the ``L`` levels it sent (``tree_depth``; ``depth`` in traces
    without it) gives ``a`` ones and, if ``a < L``, a zero; a fully accepted round's next bit is
    drawn with how often rounds that sent a level at that position of that prompt had it accepted
    (``rapid.bench.positions``), or where none did with the per-token acceptance. A round's prompt-lookup chain (``lookup_depth`` levels;
    in traces without it, the levels sent where they pass the drafted ones) records its reach at
    the round's start, counting down along its accepted run, or the longer chain a round that
    drafted nothing sent from the same position of the same prompt (``rapid.bench.positions``): a
    simulated round that drafts nothing sends that chain.

    The replay is position-aligned: every traced round adds one bit per token it emitted (a round
    that sent nothing, a drawn one), so index ``replay.starts[k] + p`` is position ``p`` of the
    ``k``-th traced generation, and a simulated generation that starts at a run start meets the
    prompt's easy and hard stretches where its traced runs met them (oasst's 11-token copy chain
    at position 12 of 24; from a random offset it fell anywhere, or past the end)."""
    sent = [(r, sent_levels(r)) for r in rounds if r.get("depth", 0) > 0]
    ones = sum(min(r["accepted"], n) for r, n in sent)
    zeros = sum(1 for r, n in sent if r["accepted"] < n)
    cal.p_accept = ones / max(ones + zeros, 1) if ones + zeros else 0.6
    rng = random.Random(seed)
    bits: list[int] = []
    reach: list[int] = []
    by_run = group_runs(rounds)
    chains, seen = chains_by_position(by_run), bits_by_position(by_run)
    replay = RoundReplay()
    for (r, kept), (_, at) in zip(_in_order(by_run), rounds_at(by_run), strict=True):
        if at == 0:
            replay.add_start(len(bits), str(r.get("policy")), str(r.get("schedule", "none")))
        n = sent_levels(r) if r.get("depth", 0) > 0 or r.get("tree_depth") else 0  # 0: sent nothing
        a = min(r["accepted"], n)
        replay.rounds[len(bits)] = TracedRound(str(r.get("policy")), int(r.get("depth", 0)), kept,
                                               int(r.get("draft_steps", 0)), n, int(r.get("tree_nodes", 0)))
        lookup = _chain_levels(r, n, kept)
        key = (r.get("set"), r.get("prompt_id"))
        here = chains.get(key, {})
        ones_zeros = seen.get(key, {}).get(at + a)
        p_next = ones_zeros[0] / sum(ones_zeros) if ones_zeros else cal.p_accept
        bits += [1] * a + [0 if a < n else int(rng.random() < p_next)]
        reach += [max(lookup - j, here.get(at + j, 0), 0) for j in range(a + 1)]
    cal.match_bits, cal.lookup_reach, cal.replay = (bits, reach, replay) if bits else ([1, 1, 0], [], RoundReplay())
    cal.levels_by_policy = _levels_by_policy(by_run)
    cal.steps_by_policy = _steps_by_policy(by_run)
    branched = [r for r in rounds if r.get("proactive_hit") is not None]
    cal.p_hit_full, cal.p_hit_part = _hit_rates(branched, 0.3)
    cal.hits_by_policy = {}
    for pol in sorted({r.get("policy") for r in branched}):
        mine = [r for r in branched if r.get("policy") == pol]
        if len(mine) >= 10:  # the branch's shape (chain vs tree, depth) is the policy's
            cal.hits_by_policy[pol] = _hit_rates(mine, sum(bool(r["proactive_hit"]) for r in mine) / len(mine))
    return cal


def _chain_levels(r: dict, sent: int, kept: int) -> int:
    """Levels the round's prompt-lookup chain offered: traced, or (older traces) the ``sent``
    levels where they pass the drafted and ``kept`` ones, else 0."""
    if "lookup_depth" in r:
        return int(r["lookup_depth"])
    return sent if sent > r.get("draft_steps", 0) + kept else 0


def _steps_by_policy(by_run: dict[tuple, list[dict]]) -> dict[str, dict[int, float]]:
    """Mean draft steps by planned levels (depth - levels kept from the branch), per policy."""
    return _per_policy(((r, r.get("depth", 0) - kept, r.get("draft_steps", 0)) for r, kept in _in_order(by_run)
                        if r.get("depth", 0) - kept > 0), statistics.fmean)


def _levels_by_policy(by_run: dict[tuple, list[dict]]) -> dict[str, dict[int, float]]:
    """Median sent levels by drafted levels (drafted steps + levels kept from the branch), per
    policy; rounds whose tree reached deeper than they drafted (lookup) are left out."""
    return _per_policy(((r, r.get("draft_steps", 0) + kept, r["tree_depth"]) for r, kept in _in_order(by_run)
                        if r.get("depth", 0) > 0 and 0 < (r.get("tree_depth") or 0) <= r.get("draft_steps", 0) + kept),
                       statistics.median)


def fully_accepted(accepted: int, depth: int) -> bool:
    """A verdict that accepted every level the round planned (``depth`` >= 1), whether or not it went
    on into a lookup chain below them: the split of the kept-branch rates, in the calibration and
    in the simulator alike (the branch then roots below the leaves, in its second wave)."""
    return depth > 0 and accepted >= depth


def _hit_rates(branched: list[dict], default: float) -> tuple[float, float]:
    """Hit rates after fully / partly accepted rounds (the pooled rate where fewer than 3)."""
    full = [bool(r["proactive_hit"]) for r in branched if fully_accepted(r["accepted"], r["depth"])]
    part = [bool(r["proactive_hit"]) for r in branched if not fully_accepted(r["accepted"], r["depth"])]
    allh = full + part
    base = sum(allh) / len(allh) if allh else default
    return (sum(full) / len(full) if len(full) >= 3 else base, sum(part) / len(part) if len(part) >= 3 else base)


def _prefill(rounds: list[dict], by_run: dict[tuple, list[dict]]) -> float:
    """Median extra draft time of an uncontended first round over its run's later steps, with the
    draft's prompt prefill before it where traced (``prefill_s``)."""
    extra = []
    for rs in by_run.values():
        rs = sorted(rs, key=lambda x: x["round"])
        later = [x["draft_s"] / x["draft_steps"] for x in rs[1:] if x.get("draft_steps", 0) > 0]
        if rs and later and rs[0].get("draft_steps", 0) > 0 and rs[0].get("load", 0.0) == 0.0:
            extra.append(rs[0].get("prefill_s", 0.0) + rs[0]["draft_s"] - rs[0]["draft_steps"] * statistics.median(later))
    return max(0.0, statistics.median(extra)) if extra else 0.0


def _traced_budget(cfg: dict) -> int:
    """The traced ``--budget``: its node count, or for ``auto`` (the tree sized to the cloud's flat
    verify size) the auto cap; the traced tree sizes (``nodes_by_depth``) take precedence anyway."""
    b = cfg.get("budget", 8)
    return AUTO_BUDGET_CAP if b == "auto" else int(b)


