"""The simulator's event loop (``rapid.bench.sim``): edges' rounds and verdicts, and the verifier
replicas' batch queues. ``es`` are the simulator's edges (``sim._Edge``)."""

from __future__ import annotations

import heapq

from rapid.bench.calibration import Calibration, fully_accepted
from rapid.bench.sim_branch import VerifyWindow, draw_count, run_branch, run_catch_up
from rapid.runtime.depth_control import observed_depth, round_depth


class Cloud:
    """The event loop: edges' rounds and verdicts, and the replicas' batch queues.

    Events ``(time, seq, kind, edge, payload)``: round (decide, draft, send), arrive (a tree reaches
    its replica's queue), cloud_free (a replica finished a batch), verdict (back at the edge)."""

    def __init__(self, es: list, cal: Calibration, replicas: int, max_batch: int, ingress_s: float) -> None:
        self.es, self.cal, self.max_batch, self.ingress_s = es, cal, max_batch, ingress_s
        self.events: list = []
        self.seq = 0
        self.queues: list[list] = [[] for _ in range(replicas)]  # per replica: (edge, nodes)
        self.busy_until = [0.0] * replicas
        self.busy = 0.0
        self.batches: list[int] = []
        self.pending: dict[int, dict] = {}

    def run_all(self) -> None:
        """Every edge's generation, from its start-up to its last token."""
        for e in self.es:
            self.push(e.startup, "round", e.idx)
        self.run()

    def push(self, t: float, kind: str, e: int, payload=None) -> None:
        heapq.heappush(self.events, (t, self.seq, kind, e, payload))
        self.seq += 1

    def run(self) -> None:
        replicas = len(self.queues)
        while self.events:
            now, _, kind, idx, payload = heapq.heappop(self.events)
            if kind == "cloud_free":
                self.start_batch(now, payload)
            elif kind == "arrive":
                self.queues[idx % replicas].append((idx, payload))
                self.start_batch(now, idx % replicas)
            elif kind == "round":
                self.on_round(self.es[idx], now)
            else:
                self.on_verdict(self.es[idx], now)

    def start_batch(self, t: float, r: int) -> None:
        queue = self.queues[r]
        if not queue or self.busy_until[r] > t:
            return
        batch, rest = queue[:self.max_batch], queue[self.max_batch:]
        queue[:] = rest
        total = sum(n for _, n in batch)
        if len(batch) > 1:
            dur, loaded = self.cal.verify(total), False
        else:  # one edge's tree: on the bench's one host, taxed by the load beside it
            e = self.es[batch[0][0]]
            dur, loaded = self.cal.verify(batch[0][1]) * e.verify_factor(t), e.loaded(t)
        self.busy_until[r] = t + dur
        self.busy += dur
        self.batches.append(len(batch))
        for idx, _ in batch:
            e = self.es[idx]
            step_tax = self.cal.step_tax if e.colocated and not loaded else 0.0  # (in a load: taxed whole)
            self.pending[idx]["verify_s"] = dur
            self.pending[idx]["window"] = VerifyWindow(t, t + dur, step_tax)
            down = e.prof.sample_rtt_s(e.rng) / 2 + self.cal.overhead_s + self.ingress_s
            self.push(t + dur + down, "verdict", idx)
        self.push(t + dur, "cloud_free", -1, r)

    def on_round(self, e, now: float) -> None:
        """Decide the depth, draft (a step at a time, as slow as the contention makes it), send."""
        if e.decision is None:
            e.decision = e.ctrl.next_depth(e.policy.proactive)
        if e.oracle:
            depth = e.oracle_depth(now)
        elif e.load_oracle:
            depth = e.load_aware_depth(now)
        elif not e.policy.drafting:
            depth = 0
        else:
            depth = round_depth(e.decision.depth, e.target - e.pos, e.reused)
        t = now
        if e.res.rounds == 0 and e.policy.drafting and e.cal.draft_ahead:
            t = e.t0  # round 0: the draft's prefill and tree while the cloud prefills (as the coordinator)
        if e.prefill and e.policy.drafting:  # the draft prefill runs inside the first round
            t += e.prefill * e.factor(t)
            e.prefill = 0.0
        planned = max(0, depth - e.reused) if depth > 0 else 0
        traced = e.traced_round(depth)  # the traced round this one follows, if any: its steps and tree
        if traced is not None:
            planned = traced.steps
        elif not e.oracle and e.policy.confidence_floor is None:  # (EdgeLLM's cut has its own model)
            # the traced steps for those levels (level 1 is often free), rounded at random
            planned = draw_count(e.rng, e.cal.steps(planned, e.policy.name))
        steps = 0
        while steps < planned:
            d = e.step_time(t) * (e.cal.step_scale(1) if e.oracle else 1.0)  # the oracle drafts a chain
            t += d
            steps += 1
            e.ctrl.observe_step(d, e.cal.step_tokens)
            if steps < planned and not e.keep_drafting(e.pos + e.reused + steps - 1):
                depth = e.reused + steps
                break
        e.res.draft_steps += steps
        t = max(t, now)  # (round 0 drafted ahead: sent once Ready is in)
        if traced is not None:  # the replayed round's tree
            nodes, levels = float(traced.nodes), traced.levels
        else:
            nodes = float(depth) if e.oracle else (e.cal.nodes(depth, e.policy.name) if depth > 0
                                                   else float(e.sent_levels(0)))  # depth 0: the lookup chain
            levels = None
        self.pending[e.idx] = {"depth": depth, "t_send": t, "t_start": now, "nodes": nodes, "levels": levels}
        self.push(t + e.prof.sample_rtt_s(e.rng) / 2, "arrive", e.idx, nodes)

    def on_verdict(self, e, t_arr: float) -> None:
        """Accept, run (or have run) the proactive branch, observe, and schedule the next round."""
        p = self.pending.pop(e.idx)
        depth, t_send = p["depth"], p["t_send"]
        cap = e.sent_levels(depth, p["levels"])
        a = e.run_len(e.pos, cap)
        full = fully_accepted(a, depth)  # as calibrated: a chain below the planned levels does not count
        hit = e.hit(e.pos + a, full)
        may_end = cap + 1 >= e.target - e.pos  # the verdict may end the generation (BranchGate)
        e.reused = 0
        kept, end = None, t_arr  # kept: whether a proactive branch ran and was kept
        pol, window = e.policy, p["window"]
        if pol.proactive and pol.drafting and depth > 0 and (not e.oracle or hit):
            # a verdict inside the tree lands on a first-wave root, a fully accepted one on a leaf's
            end, kept = run_branch(e, t_send, t_arr, a, depth, (1 if full else 0) if hit else None, window, may_end)
        elif pol.proactive and pol.drafting and not e.oracle and depth == 0 and e.res.depths[-1:] == [0]:
            end = run_catch_up(e, t_send, t_arr, window, may_end)
        t_arr += window.grown  # the steps beside the verify made it (and the verdict) that much later
        verify_s = p["verify_s"] + window.grown
        if pol.drafting:  # as the coordinator: the link's share of the wait = arrival - send - verify
            e.ctrl.observe_verdict(depth, round(p["nodes"]), verify_s, t_arr - t_send - verify_s, a, kept)
        sampled = observed_depth(depth, e.target - e.pos) if pol.drafting else max(depth, 1)  # as the coordinator
        e.ctrl.observe_round(a, sampled, t_arr - t_send, e.decision.b_hat)
        if pol.drafting:
            e.observe_chain(a)
        e.pos += a + 1
        if pol.cost_aware:  # the only controller that prices the lookup chains (as the coordinator)
            e.ctrl.observe_lookup(*e.lookup_outlook())
        e.decision = e.ctrl.next_depth(pol.proactive, e.reused)
        e.res.tokens = min(e.pos, e.target)
        e.res.rounds += 1
        e.res.accepted += a
        e.res.depths.append(depth)
        if e.pos >= e.target:
            e.res.wall_s = end
        else:
            self.push(end, "round", e.idx)
