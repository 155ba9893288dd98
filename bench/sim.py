"""``rapid sim``: a discrete-event model of RAPID rounds, calibrated from ``rapid bench`` traces.

Model (one edge; N edges share one cloud in the scale study):
- edge step time = a sample of the measured uncontended per-step times × the contention
  slowdown while the schedule is active (slowdown measured from the contended rounds);
- cloud response = up-link delay + queueing + verify(nodes) + down-link delay, verify(nodes)
  the traced ``verify_s`` medians of rounds with the edge idle (or a GPU profile JSON, seconds vs
  nodes), the RTT drawn from the network profile, plus the measured transport overhead;
- one edge (as the bench ran it, beside its cloud on one host) pays the co-location tax fitted
  from the traces (``rapid.bench.colocation``): its verify × the schedule's factor in (out of)
  the load, and + ``step_tax`` seconds per second of its own branch or catch-up step beside an
  unloaded verify (the verdict lands that much later); many edges model a cloud elsewhere;
- a step out of a burst's load runs at the slowdown traced there (``rapid.bench.step_fit``);
- a branch or catch-up step, beside the verify, feeds the tokens traced for that kind and runs
  at the traced beside tax (1.0 for a cloud elsewhere; ``rapid.bench.beside_fit``);
- acceptance replayed from the traces as a per-position match string (a round that accepted a
  of the L levels it sent gives a ones and, if a < L, a zero; a fully accepted round's next bit
  is drawn with the traced per-token acceptance), a generation starting where one of its
  policy's traced generations (under its schedule where traced) started, and a round that starts
  where its traced twin did with the same plan taking that round's steps, levels and nodes
  (``rapid.bench.round_replay``); proactive hits drawn per position with the
  traced hit rates (separately for fully and partly accepted rounds); a kept branch supplies
  the levels traced for its step count, per policy (its roots share its steps);
- the tree's shape as traced per policy: the draft steps a planned depth ran (level 1 is often
  free), the levels the send cut kept, and, aligned with the match string, the reach of a
  prompt-lookup chain where a traced tree went deeper than it drafted (a simulated round sends
  max(kept levels, reach) levels); a non-interruptible chain branch runs its traced steps, each
  costing the traced chain-step time; an interruptible branch asks the runtime's ``BranchGate``
  before each step, fed as the coordinator feeds it (step and send→verdict times, and the root
  wave a verdict lands on: a verdict inside the tree on the first, a fully accepted one on the
  second; a drawn hit counts only when a step ran; ``rapid.bench.sim_branch``);
- a round that drafts nothing (``rapid-cost`` at depth 0) sends the replayed lookup chain alone
  (no branch); a cost-aware controller is told the chain the next tree would carry after every
  verdict, as the coordinator tells it (``observe_lookup``): the replayed reach at the new
  position, each level at ``p^k`` with the request's ``LookupStats`` learnt from the chains'
  outcomes in the replay (``lookup_outlook``);
- where the traces say the bench carried each policy's controller across generations
  (``Calibration.warm_controller``), a throwaway generation under the same schedule runs first
  (on ``previous``'s replay where given: validation passes the prompt set the bench ran before)
  and the measured one starts with its controller and branch gate after ``new_request``.

The SAME policy code decides: the policy flags are the ``rapid.runtime.policies.POLICIES``
objects, and the depth controller is the one ``rapid.runtime.coordinator.Coordinator`` builds
(``CAAC`` / ``FixedDepth`` of ``rapid.runtime.caac``, ``CostAwareCAAC`` of ``rapid.runtime.cost_caac``),
fed through ``observe_cloud`` (the verify model at the start-up curve's sizes, as ``Ready``) /
``observe_step`` / ``observe_verdict`` (verify_s, tree nodes, RTT = arrival - send - verify_s) /
``observe_round`` / ``next_depth`` in the coordinator's order: a round's depth is settled when
the previous verdict lands (at least the levels a kept branch supplied), and the proactive
branch aims at ``next_depth_if`` the verdict it guesses (the sim, with no tree, takes the
round's accepted length for that guess).

The oracle knows the future match string, the hits and the contention: knowing the path, it
drafts a chain (one token per step, one node per level) of the depth, up to the run that will be
accepted, that starts the fastest plan over the next positions (``bench.oracle_plan``, replanned
every round), and expands a proactive chain only when it will be kept, of the planned length
(the steps done by the verdict, or one more), stopped at the first step boundary after it. A step feeding T tokens costs ``Calibration.step_scale(T)`` tree steps (linear in
T as traced on this CPU, or a preset's curve: ``bench.presets``).
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field

from rapid.bench.calibration import Calibration
from rapid.bench.contention import Schedule
from rapid.bench.netem import NetProfile
from rapid.bench.oracle_plan import plan_depth
from rapid.bench.round_replay import TracedRound
from rapid.bench.sim_cloud import Cloud
from rapid.bench.sim_lookup import chain_outlook, observe_chain
from rapid.runtime.branch_gate import BranchGate
from rapid.runtime.coordinator import CoordinatorConfig, controller_for
from rapid.runtime.lookup import LookupStats
from rapid.runtime.policies import POLICIES, Policy
from rapid.runtime.tree import TreeParams

ORACLE = "oracle"
ORACLE_LOAD = "oracle-load"  # knows the future contention but not the acceptance
ORACLE_HORIZON = 48  # positions planned ahead: within 0.1 % of 96 on three preset cells (docs/bench.md)
# the tree sizes (nodes after the root) of the verify curve the cloud measures at start-up and
# sends in Ready: T - 1 for server.main.FLAT_PROBE_TOKENS (not imported: the sim is torch-free)
STARTUP_CURVE_NODES = (0, 3, 7, 15, 31)


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
                 tokens: int, seed: int, phase: float, startup: bool, config: CoordinatorConfig,
                 colocated: bool = False) -> None:
        self.idx = idx
        self.colocated = colocated  # beside its cloud on one host, as the bench ran: the verify is taxed
        self.oracle = policy == ORACLE
        self.load_oracle = policy == ORACLE_LOAD
        self.policy = POLICIES["rapid"] if isinstance(policy, str) else policy
        # the controller exactly as the runtime's coordinator builds it
        self.ctrl = controller_for(self.policy, config)
        self.cal, self.sched, self.prof = cal, sched, prof
        if cal.warm_controller:  # as rapid bench / the daemon: a baseline learned uncontended
            wr = random.Random(seed * 7 + idx)
            for _ in range(4 * self.ctrl.config.n_warmup):
                self.ctrl.observe_step(wr.choice(cal.step_s), cal.step_tokens)
        self.ctrl.new_request()
        # Ready: the cloud's start-up verify curve (its verify model) and the session's tree shape
        # (the session's budget: the largest traced tree, as --budget auto sized it to the cloud)
        budget = max((round(v) for v in cal.nodes_by_depth.values()), default=cal.budget)
        self.budget = budget
        self.lookup = LookupStats(TreeParams().lookup_p)  # per request, as the drafter's
        self.ctrl.observe_cloud(STARTUP_CURVE_NODES, [cal.verify(n) for n in STARTUP_CURVE_NODES], budget,
                                cal.step_tokens)
        self.prefill = cal.prefill_s
        self.target = tokens
        self.rng = random.Random(seed * 1_000_003 + idx)
        self.phase = phase
        # a traced generation's start (its policy's where traced: rapid.bench.round_replay), else anywhere
        k = seed * 7919 + idx * 104729
        starts = cal.replay.starts_for(None if self.oracle or self.load_oracle else self.policy.name, sched.name)
        self.offset = starts[k % len(starts)] if starts else k % len(cal.match_bits)
        hr = random.Random(seed * 31 + idx)
        self.u_hit = [hr.random() for _ in range(tokens + 16)]
        self.res = EdgeResult()
        self.pos = 0
        self.reused = 0
        self.t0 = 0.0
        self.startup = cal.startup_s if startup else 0.0
        self.decision = None
        self.oracle_branch = 0  # the oracle's planned proactive steps for the round in flight

    @property
    def gate(self) -> BranchGate:
        """The branch gate, as the coordinator's: the controller's, carried with it."""
        return self.ctrl.gate

    # -- model pieces

    def bit(self, p: int) -> int:
        bits = self.cal.match_bits
        return bits[(self.offset + p) % len(bits)]

    def run_len(self, p: int, cap: int) -> int:
        k = 0
        while k < cap and self.bit(p + k):
            k += 1
        return k

    def traced_round(self, depth: int) -> TracedRound | None:
        """The traced round of this policy that started here with the same plan (``depth`` and
        the levels kept from the branch), which this round replays (``rapid.bench.round_replay``);
        None for the oracles and EdgeLLM's cut (their own models)."""
        if self.oracle or self.load_oracle or self.policy.confidence_floor is not None:
            return None
        index = (self.offset + self.pos) % len(self.cal.match_bits)
        return self.cal.replay.at(index, self.policy.name, depth, self.reused)

    def sent_levels(self, depth: int, traced: int | None = None) -> int:
        """Levels of the tree a round sends for a drafted ``depth``: ``traced`` (the replayed
        round's), else the traced levels after the send cut, or a longer prompt-lookup chain where
        the replay offers one (the oracle drafts exactly the chain it planned). A round that
        drafts nothing (depth 0: ``rapid-cost``) sends the chain alone. As the coordinator,
        nothing past ``left - 1`` levels (the bonus token ends the generation there)."""
        if self.oracle or not self.policy.drafting:
            return depth
        chain = self.cal.reach(self.offset + self.pos)
        levels = chain if depth <= 0 else max(self.cal.levels(depth, self.policy.name), chain)
        return min(levels if traced is None else traced, max(0, self.target - self.pos - 1))

    def lookup_outlook(self) -> tuple[list[float], int]:
        """As ``Drafter.lookup_outlook``: the replayed chain here (at most the session's budget)."""
        return chain_outlook(self.lookup, min(self.cal.reach(self.offset + self.pos), self.budget), self.cal.min_p)

    def observe_chain(self, accepted: int) -> None:
        """As the drafter after a verdict: the request's LookupStats learn the chain's outcome."""
        observe_chain(self.lookup, self.cal.reach(self.offset + self.pos), accepted)

    def loaded(self, t: float) -> bool:
        """Whether the contention load runs at ``t``."""
        return self.sched.active(t - self.t0 + self.phase)

    def factor(self, t: float) -> float:
        s = self.sched
        if not self.loaded(t):  # out of the load: as traced out of it
            return self.cal.idle_slowdown_by_schedule.get(s.name, 1.0)
        slow = self.cal.slowdown_by_schedule.get(s.name)
        if slow is not None:  # measured under this very schedule
            return slow
        return 1.0 + (self.cal.slowdown - 1.0) * s.intensity / max(self.cal.cal_intensity, 1e-9)

    def verify_factor(self, t: float) -> float:
        """The co-location tax on a verify that starts at ``t`` (the bench's one host): as traced
        in (out of) this schedule's load, else 1 + load_tax · I / I_cal in a load; 1 for a cloud
        elsewhere."""
        s = self.sched
        if not self.colocated or s.kind == "none":
            return 1.0
        active = self.loaded(t)
        if s.name in self.cal.verify_by_schedule:
            return self.cal.verify_by_schedule[s.name][0 if active else 1]
        return 1.0 + self.cal.load_tax * s.intensity / max(self.cal.cal_intensity, 1e-9) if active else 1.0

    def step_time(self, t: float) -> float:
        return self.rng.choice(self.cal.step_s) * self.factor(t)

    def mean_step(self, t: float) -> float:
        return statistics.median(self.cal.step_s) * self.factor(t)

    def hit(self, pos_end: int, full: bool) -> bool:
        c = self.cal
        p_full, p_part = c.hits_by_policy.get(self.policy.name, (c.p_hit_full, c.p_hit_part))
        p = p_full if full else p_part
        return self.u_hit[min(pos_end, len(self.u_hit) - 1)] < p

    def keep_drafting(self, p: int) -> bool:
        """EdgeLLM's confidence cut after drafting the token at position ``p`` (calibrated)."""
        if self.policy.confidence_floor is None or self.cal.cut_continue is None:
            return True
        return self.rng.random() < self.cal.cut_continue[self.bit(p)]

    def load_aware_depth(self, t: float) -> int:
        """argmax_d E[tokens] / E[seconds] with i.i.d. acceptance p: E[tokens] = 1 + sum_k p^k."""
        maxd = min(self.ctrl.config.max_depth, self.target - self.pos)
        s, p = self.mean_step(t), self.cal.p_accept
        rtt = self.prof.rtt_ms / 1000 + self.cal.overhead_s

        def rate(d: int) -> float:
            gain = 1 + sum(p ** k for k in range(1, d + 1))
            return gain / (max(0, d - self.reused) * s + self.cal.verify(self.cal.nodes(d, self.policy.name)) + rtt)

        return max(range(1, max(1, maxd) + 1), key=rate)

    def oracle_depth(self, t: float) -> int:
        """The first depth of the fastest plan over the next ``ORACLE_HORIZON`` positions
        (``rapid.bench.oracle_plan``): knowing the path it drafts a chain (one token per step,
        d nodes, d ≤ the run that will be accepted) and knows which branches will be kept."""
        maxd = self.ctrl.config.max_depth
        h = min(ORACLE_HORIZON, self.target - self.pos)
        runs = [self.run_len(self.pos + j, min(maxd, self.target - self.pos - j)) for j in range(h)]
        after = [self.hit(self.pos + j, True) for j in range(h + maxd)]
        empty = [self.hit(self.pos + j, False) for j in range(h)]
        link = self.prof.rtt_ms / 1000 + self.cal.overhead_s
        wait = [self.cal.verify(float(d)) + link for d in range(maxd + 1)]
        depth, self.oracle_branch = plan_depth(runs, after, empty, self.reused,
                                               self.mean_step(t) * self.cal.step_scale(1), wait, maxd)
        return depth


def simulate(policy: Policy | str, cal: Calibration, sched: Schedule, prof: NetProfile, tokens: int = 256,
             seed: int = 0, edges: int = 1, max_batch: int = 64, startup: bool = True,
             config: CoordinatorConfig | None = None, replicas: int = 1, ingress_s: float = 0.0,
             previous: Calibration | None = None, colocated: bool | None = None) -> dict:
    """Run ``edges`` edges until each has ``tokens`` tokens; returns per-edge results and cloud stats.

    ``replicas`` verifiers (Ray Serve scale-out) each batch their own queue; edge i's session lives
    on replica i mod replicas (the router spreads new sessions evenly); ``ingress_s`` is the extra
    round-trip time of the ingress hop, added to every verdict. cloud_util = mean over replicas.
    ``previous``: the replay a carried controller's throwaway generation runs on (the prompt set
    the bench ran before; default ``cal``). ``colocated``: the edge beside its cloud on one host,
    as ``rapid bench`` ran it, so the verify pays ``cal``'s co-location tax (default: one edge; many
    edges model a cloud on its own machine).
    """
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    config = config or CoordinatorConfig(depth=cal.depth)
    colocated = edges == 1 if colocated is None else colocated
    rng = random.Random(seed)
    period = (sched.on_s + sched.off_s) if sched.kind == "burst" else 0.0
    phases = [rng.random() * period if edges > 1 else 0.0 for _ in range(edges)]

    def generation(s: int, c: Calibration) -> Cloud:  # every edge's generation, drawn from seed s
        return Cloud([_Edge(i, policy, c, sched, prof, tokens, s, phases[i], startup, config, colocated)
                      for i in range(edges)], c, replicas, max_batch, ingress_s)

    sim = generation(seed, cal)
    es = sim.es
    if cal.warm_controller and policy not in (ORACLE, ORACLE_LOAD):
        _carry_from_a_previous_generation(es, generation(seed + 1_000_003, previous or cal))
    sim.run_all()
    horizon = max(e.res.wall_s for e in es)
    return {"edges": [e.res for e in es], "cloud_util": sim.busy / replicas / horizon if horizon > 0 else 0.0,
            "mean_batch": statistics.fmean(sim.batches) if sim.batches else 0.0, "horizon_s": horizon}


def _carry_from_a_previous_generation(es: list, previous: Cloud) -> None:
    """As ``rapid bench`` and the edge daemon carry each policy's controller (and branch gate)
    across generations: the throwaway ``previous`` generation (the same edges and schedule, another
    seed) runs first, then each edge starts its measured one with that controller after
    ``new_request`` (the logical path reset, the step baselines, costs and rapid-cost's probe
    interval kept)."""
    previous.run_all()
    for e, w in zip(es, previous.es, strict=True):
        e.ctrl = w.ctrl
        e.ctrl.new_request()


def sim_tok_s(policy, cal, sched, prof, tokens, seeds, **kw) -> float:
    """Tokens per second of ``seeds`` simulated runs, pooled as the bench report pools a cell's
    prompts (``rapid.bench.paired_runs.pooled_by_repeat``): every generation's tokens over every
    generation's wall seconds. A mean of per-generation rates weighs a quick generation as much as a
    slow one: on five prompts a set, one of them 2.98 tok/s and four 7.3-8.9, the mean is 7.33 and
    the pooled rate 6.14, and that gap alone read as a 28 % simulator error."""
    res = [r for s in range(seeds) for r in simulate(policy, cal, sched, prof, tokens, s, **kw)["edges"]]
    wall = sum(r.wall_s for r in res)
    return sum(r.tokens for r in res) / wall if wall > 0 else 0.0
