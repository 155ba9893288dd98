"""One generation as a sequence of rounds (the edge side of RAPID).

Round i:
    t0  depth L_i from the controller (CAAC, or fixed), decided when verdict i-1 landed; at
        least the levels a kept branch already supplied
        expand D_i to L_i levels (worker thread; the event loop never runs a draft step)
    t1  send D_i; if the policy is proactive, save the boundary and expand the branch D_{i+1}
        towards the depth the controller would choose if the branch guesses right (the
        branch's root v* fixes the accepted length of that verdict: next_depth_if); where D_i
        drafted nothing (depth 0), feed the pending tokens instead (one measured step)
    t2  after EACH branch step, once the engine reports it complete (StepHandle.ready(): the
        CUDA event on GPU backends; the drafter polls it), read the feedback flag the link sets
        on a verdict; interruptible policies stop there (no step starts after it), and start a
        step that would run past the expected verdict only when it pays (runtime.branch_gate)
    t3  verdict: keep and remap the branch if it guessed the outcome (accepted path ends at v*
        and bonus = b*), otherwise restore the boundary; commit path + bonus; the controller
        observes round i (against the B_hat that set L_i) and settles L_{i+1}

Round 0's tree needs nothing from the cloud (its root is the prompt's last token), so the draft's
prefill and that tree run on a worker while the cloud prefills the prompt (Hello → Ready); only
what outlasts Ready is on the round's path (``RoundRecord.ahead_s``: the part that was not).

The cloud's acceptance rule is untouched, so the emitted tokens equal target-only decoding
whatever the policy, the timing or the interruptions. With ``logprobs`` k >= 0 the cloud also
scores every emitted token (``Generation.scores``, ``rapid.runtime.token_scores``): the same
float32 numbers target-only decoding gives, since they come from the same logits rows.

Drafting runs on worker threads, which asyncio cannot cancel. Every worker is tracked; however a
generation ends (verdict, error, cancellation, a caller's abort) it sets the halt flag, which
workers read after every complete step (no step starts after it), and waits for them, so the
engine is idle before the caller hands it to the next request.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from rapid.core.sampling import SamplingParams
from rapid.core.wire import Hello
from rapid.runtime.branch_gate import WAVES
from rapid.runtime.budget import settle_cloud, settle_draft
from rapid.runtime.controllers import CoordinatorConfig, controller_for
from rapid.runtime.cost_caac import CostAwareCAAC
from rapid.runtime.depth_control import CAACDecision, DepthController, observed_depth, round_depth
from rapid.runtime.drafter import Drafter
from rapid.runtime.emitted import Emitted
from rapid.runtime.link import CloudLink
from rapid.runtime.policies import Policy
from rapid.runtime.telemetry import RoundRecord, Summary, summarize
from rapid.runtime.token_scores import TokenScore
from rapid.runtime.tree_cut import TreeCut


@dataclass(slots=True)
class Generation:
    tokens: list[int]
    records: list[RoundRecord]
    summary: Summary
    stopped: bool  # hit a stop token (else max_new)
    scores: list[TokenScore] = field(default_factory=list)  # per token, when logprobs were asked for


class _Halted(Exception):
    """Raised in a worker thread at a step boundary once the generation has ended."""


class Coordinator:
    def __init__(self, drafter: Drafter, link: CloudLink, policy: Policy,
                 config: CoordinatorConfig | None = None, clock: Callable[[], float] = time.perf_counter,
                 step_hook: Callable[[str, int], None] | None = None,
                 controller: DepthController | None = None, executor: Executor | None = None) -> None:
        self.drafter = drafter
        self.link = link
        self.policy = policy
        self.cfg = config or CoordinatorConfig()
        self.clock = clock
        self.step_hook = step_hook  # called after every complete step (tests inject delays)
        # a caller-owned controller (see controller_for) carries the device's latency baseline
        # across generations; generate() resets only its logical path
        self.controller = controller if controller is not None else controller_for(policy, self.cfg)
        # how many of a drafted tree's nodes to send (rapid.runtime.tree_cut), over the cloud costs
        # the cost-aware controller keeps (one set of estimates per session), else its own
        self.cut = TreeCut(self.controller.costs if isinstance(self.controller, CostAwareCAAC) else None)
        self.executor = executor  # the worker threads (None: the loop's default pool, shared by everyone)
        # when an interruptible branch starts a step (runtime.branch_gate): the controller's, so its
        # estimates are carried across generations with the controller's latency baseline
        self.gate = self.controller.gate
        self._waves = WAVES  # root waves of the current branch: 1 where a second step would end late
        self._halt = threading.Event()  # set when a generation ends: workers stop at the next step
        self._beside = [0.0, 0]  # this round's steps beside the verify (branch, catch-up): seconds, tokens
        self._workers: set[asyncio.Future] = set()

    def _after_step(self, rec, phase: str, k: int) -> None:
        if self._halt.is_set():
            raise _Halted
        self.controller.observe_step(rec.seconds, rec.tokens, beside=phase != "draft")  # (runtime.step_cost)
        if phase != "draft":
            self._beside[0] += rec.seconds
            self._beside[1] += rec.tokens
        if self.cfg.step_delay_s:
            time.sleep(self.cfg.step_delay_s)
        if self.step_hook:
            self.step_hook(phase, k)

    def _draft(self, depth: int) -> int:
        """Worker: expand the active tree to ``depth`` levels; with the send cut on, no further
        step where the cut would send nothing it adds (``TreeCut.pays_to_grow``); steps run."""
        d, t0, count, last = self.drafter, self.clock(), 0, 0.0

        def on_step(rec):
            nonlocal count, last
            count, last = count + 1, rec.seconds
            self._after_step(rec, "draft", count)

        def pays(bound: float, added: int) -> bool:  # the drafting so far and the step it asks for
            return self.cut.pays_to_grow(d.tree.score, self.clock() - t0 + last, bound, added, d.lookup_flags())

        d.draft(depth, on_step, self.policy.confidence_floor, pays if d.params.cost_cut else None)
        return count

    def _branch(self, depth: int, if_hit: Callable[[int], int] | None = None,
                t_sent: float | None = None, may_end: bool = False) -> tuple[int, int | None]:
        """Expand the proactive branch to ``depth`` levels, or, with ``if_hit``, to
        ``if_hit(accepted)`` once the root is chosen (``accepted`` = the verdict's length if the
        branch guesses right); return (steps run, step after which feedback stopped it). An
        interruptible policy asks the gate before each step (``t_sent``: when D_i was sent), and
        first whether a second wave of roots could be fed before the verdict: if not, the first
        step feeds the first wave alone (``BranchGate.second_wave``)."""
        steps = 0
        width = 1 if self.policy.chain_branch else None
        d = self.drafter
        gated = self.policy.interruptible and t_sent is not None
        self._waves = WAVES if not gated or self.gate.second_wave(self.clock() - t_sent) else 1
        it = d.proactive_steps(width, self._waves > 1)
        while not gated or self.gate.start(self.clock() - t_sent, min(steps, self._waves - 1), may_end):
            rec = next(it, None)
            if rec is None:
                break
            steps += 1
            self.gate.observe_step(rec.seconds)
            try:
                self._after_step(rec, "branch", steps)
            except _Halted:
                return steps, steps
            # t2: the drafter returned the step only once handle.ready() (the CUDA event on GPU
            # backends) said it is complete → read the flag
            if self.policy.interruptible and self.link.feedback.is_set():
                return steps, steps
            if if_hit is not None and d.roots.best is not None:
                depth, if_hit = if_hit(0 if d.roots.best.node < 0 else d.tree.depth[d.roots.best.node]), None
            if d.roots.levels(d.tree) >= depth:
                break
        return steps, None

    def _catch_up(self, t_sent: float, may_end: bool = False) -> float:
        """A round that drafted nothing, while the cloud verifies: feed the pending tokens (one step,
        ``Drafter.catch_up``) where the gate says so (``BranchGate.catch_up``: if it should end before
        the verdict, else once in a few rounds); its seconds (0.0: none ran). Measured as any draft
        step, it keeps the controller's slowdown current while it drafts nothing (else a lifted
        load is seen at the next probe, up to 32 rounds on)."""
        if not self.gate.catch_up(self.clock() - t_sent, may_end):
            return 0.0
        rec = self.drafter.catch_up()
        if rec is None:
            return 0.0
        self.gate.observe_catch_up(rec.seconds)
        try:
            self._after_step(rec, "catch_up", 1)
        except _Halted:
            pass
        return rec.seconds

    def _if_hit(self, depth: int, b_hat: float) -> Callable[[int], int]:
        """The branch's depth target given the accepted length of the verdict it guesses."""
        return lambda accepted: self.controller.next_depth_if(accepted, max(depth, 1), b_hat, True).depth

    def _spawn(self, fn: Callable[..., Any], *args: Any) -> asyncio.Future:
        """Run ``fn`` on a worker thread, tracked until it returns (see the module docstring)."""
        fut = asyncio.get_running_loop().run_in_executor(self.executor, fn, *args)
        self._workers.add(fut)
        fut.add_done_callback(self._settled)
        return fut

    def _settled(self, fut: asyncio.Future) -> None:
        self._workers.discard(fut)
        if not fut.cancelled():
            fut.exception()  # retrieved: a halted worker's _Halted is expected, others re-raise at the await

    async def _drain(self) -> None:
        """Halt every worker at its next step boundary and wait for it, even when cancelled."""
        self._halt.set()
        cancelled = False
        while self._workers:
            try:
                await asyncio.wait(set(self._workers))
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            raise asyncio.CancelledError

    async def generate(self, prompt: Sequence[int], max_new: int, sampling: SamplingParams,
                       on_tokens: Callable[[list[int]], None] | None = None, *, logprobs: int = -1,
                       fit_cloud: bool = False,
                       on_scores: Callable[[list[TokenScore]], None] | None = None) -> Generation:
        """Generate up to ``max_new`` tokens (see the module docstring); the cloud session is
        closed and every worker thread has stopped when this returns or raises.

        ``logprobs``: -1 none, k >= 0 the target's log-probability of each token and its top k
        (``on_scores`` gets them just before ``on_tokens`` gets the same tokens). ``fit_cloud``:
        ``max_new`` is an upper bound lowered to what the cloud's context holds (a request
        without max_tokens), instead of a limit the cloud must fit (ContextFullError)."""
        d = self.drafter
        d.params = settle_draft(d.params, d.engine.info.capacity, len(prompt), max_new)
        self._halt.clear()
        t_begin = self.clock()
        try:
            d.start(prompt, sampling)  # under sampling the drafter couples to the target's noise
            self.controller.new_request()
            decision = self.controller.next_depth(self.policy.proactive)
            ahead = _Ahead(decision, round_depth(decision.depth, max_new, d.levels))
            # the draft's prefill and round 0's tree while the cloud prefills (neither needs Ready)
            work = self._spawn(self._draft_ahead, ahead) if self.policy.drafting else None
            ready = await self.link.open(Hello(list(prompt), sampling.temperature, sampling.top_p, sampling.top_k,
                                               sampling.seed, max_nodes=d.params.budget, logprobs=logprobs),
                                         d.transcript)
            t_ready = self.clock()
            if work is not None:  # before settle_cloud changes the params the worker reads
                await asyncio.shield(work)
            d.params, max_new = settle_cloud(d.params, ready, len(prompt), max_new, self.policy.drafting, fit_cloud)
            curve_s = [us / 1e6 for us in ready.curve_us]
            self.controller.observe_cloud(ready.curve_nodes, curve_s, d.params.budget, d.params.width)
            self.cut.observe_cloud(ready.curve_nodes, curve_s)
            out, records, stopped, scores = await self._rounds(max_new, on_tokens, on_scores, ahead, t_ready)
        finally:
            try:
                await self._drain()
            finally:
                await self.link.close()
        wall, ttft = self.clock() - t_begin, (records[0].t_end - t_begin if records else None)  # to the 1st verdict
        return Generation(out, records, summarize(self.policy.name, records, len(out), wall, ttft), stopped, scores)

    def _draft_ahead(self, ahead: _Ahead) -> None:
        """Worker: the draft's prompt prefill, then round 0's tree (``ahead.depth`` levels)."""
        step = self.drafter.prefill()
        ahead.prefill_s = step.seconds if step is not None else 0.0
        t0 = self.clock()
        ahead.steps = self._expand(ahead.depth)
        ahead.t_done = self.clock()
        ahead.draft_s = ahead.t_done - t0

    async def _rounds(self, max_new: int, on_tokens: Callable[[list[int]], None] | None,
                      on_scores: Callable[[list[TokenScore]], None] | None, ahead: _Ahead, t_ready: float):
        """The rounds, each draft → send (+ branch) → await → apply, round 0's tree drafted ahead
        (``ahead``; the cloud's Ready came at ``t_ready``); returns (tokens, records, stopped, scores)."""
        out = Emitted(self.drafter.transcript, max_new, self.drafter.stop_ids, on_tokens, on_scores)
        decision = ahead.decision
        round_id = 0
        while True:
            left = max_new - len(out.tokens)
            depth = round_depth(decision.depth, left, self.drafter.levels)
            rec = RoundRecord(round_id, self.policy.name, depth if self.policy.drafting else 0, 0,
                              t_start=t_ready if round_id == 0 else self.clock())
            _fill_decision(rec, decision)
            tokens, parents, sent = await self._draft_round(depth, left, rec, ahead if round_id == 0 else None)
            may_end = rec.tree_depth + 1 >= left  # the verdict may end the generation (BranchGate)
            verdict = await self._send_and_await(round_id, tokens, parents, depth, decision, rec, may_end)
            emitted, decision = self._apply(verdict, depth, decision, rec, sent, left)
            done = out.take(verdict, emitted, rec)
            rec.t_end = self.clock()
            out.records.append(rec)
            if done:
                return out.tokens, out.records, out.stopped, out.scores
            round_id += 1

    def _expand(self, depth: int) -> int:
        """Worker: expand the active tree to ``depth`` levels (0: the lookup chains alone); steps run."""
        if depth == 0:  # no draft step: the lookup chains alone (rapid.runtime.cost_caac)
            self.drafter.lookup_round()
            return 0
        return self._draft(depth)

    async def _draft_round(self, depth: int, left: int, rec: RoundRecord,
                           ahead: _Ahead | None = None) -> tuple[list[int], list[int], SentTree]:
        """Expand D_i to ``depth`` levels on a worker (round 0: already drafted ``ahead``, while the
        cloud prefilled; only what it drafted after Ready is on the round's path), drop what cannot be
        emitted (nodes deeper than ``left - 1``: a lookup chain or a kept branch reaches past the last
        round's end, and the bonus token supplies the last one), cut it to the nodes that pay for
        their verify time (``TreeParams.cost_cut``); the wire tree and what the cut learns from
        (empty for ``ar``)."""
        if not self.policy.drafting:
            return [], [], SentTree()
        d = self.drafter
        if ahead is None:
            t0 = self.clock()
            rec.draft_steps = await asyncio.shield(self._spawn(self._expand, depth))
            rec.draft_s = self.clock() - t0
        else:
            rec.draft_steps, rec.draft_s, rec.prefill_s = ahead.steps, ahead.draft_s, ahead.prefill_s
            rec.ahead_s = min(ahead.draft_s, max(0.0, rec.t_start - (ahead.t_done - ahead.draft_s)))
            d.cut(d.params.budget)  # drafted under the budget before Ready, which may have lowered it
        d.tree.cap_depth(left - 1)
        if d.params.cost_cut:
            d.cut(self.cut.nodes(d.tree.score, rec.draft_s - rec.ahead_s, d.lookup_flags()))
        tokens, parents = d.wire_tree()
        flags = d.lookup_flags()
        rec.tree_nodes, rec.tree_depth = len(tokens), d.tree.max_depth
        rec.lookup_depth = max((k for k, on in zip(d.tree.depth, flags, strict=True) if on), default=0)
        rec.lookup_p = d.lookup.p
        return tokens, parents, SentTree(list(d.tree.score), flags)

    async def _send_and_await(self, round_id: int, tokens: list[int], parents: list[int], depth: int,
                              decision: CAACDecision, rec: RoundRecord, may_end: bool = False):
        """Send D_i, expand the proactive branch while the cloud verifies, await the verdict, and
        keep the branch only where it guessed the outcome (else restore the saved boundary);
        ``may_end``: D_i reaches the generation's last token, so no step bets past the verdict."""
        d, p = self.drafter, self.policy
        t_sent = self.clock()
        await self.link.send_tree(round_id, tokens, parents)
        branch_task = catch_task = None
        self._beside = [0.0, 0]
        if p.proactive and p.drafting and d.levels > 0:  # (a tree that drafted nothing has no fed node)
            boundary = d.save_boundary()
            branch_task = self._spawn(self._branch, self.controller.next_depth(True).depth,
                                      self._if_hit(depth, decision.b_hat), t_sent, may_end)
        elif p.proactive and p.drafting:  # it drafted nothing: the wait feeds what is pending instead
            catch_task = self._spawn(self._catch_up, t_sent, may_end)
        verdict = await self.link.verdict(round_id)  # raises: _drain stops the branch first
        rec.cloud_s = self.link.arrival(round_id) - t_sent
        if catch_task is not None:
            rec.catch_up_s = await asyncio.shield(catch_task)
        if branch_task is not None:
            rec.proactive_steps, rec.interrupted_at = await asyncio.shield(branch_task)
            path = list(verdict.path)
            rec.proactive_hit = d.branch_hit(path, verdict.bonus)
            rec.branch_outcome = d.branch_outcome(path, verdict.bonus)
            if d.roots:  # roots chosen: judged even when the gate stopped it before they were fed
                rec.first_wave_p = d.roots.mass(0)
                self.gate.observe_kept(d.branch_landing(path, verdict.bonus), self._waves if rec.proactive_steps else 1)
            if not rec.proactive_hit:
                rec.discarded_steps = rec.proactive_steps
                d.restore_boundary(boundary)
        rec.beside_s, rec.beside_tokens = self._beside  # the worker has returned (awaited above)
        self.gate.observe_cloud(rec.cloud_s)  # after the branch: its worker reads the gate
        rec.wait_s = self.clock() - t_sent
        rec.verify_s = verdict.verify_s
        return verdict

    def _apply(self, verdict, depth: int, decision: CAACDecision, rec: RoundRecord,
               sent: SentTree, left: int) -> tuple[list[int], CAACDecision]:
        """Commit path + bonus in the drafter, let the controller and the send cut observe round i
        (``sent``: the sent tree's scores and lookup flags; ``left``: tokens still to go before it);
        (the emitted tokens, the decision for L_{i+1})."""
        d, p_drafts = self.drafter, self.policy.drafting
        plan = d.apply_verdict(list(verdict.path), verdict.bonus)
        if plan.hit:
            rec.reused_depth = d.levels
        rec.accepted = len(verdict.path)
        if p_drafts:
            rtt = rec.cloud_s - verdict.verify_s  # the link's share of the wait: arrival - send - verify
            self.controller.observe_verdict(depth, rec.tree_nodes, verdict.verify_s, rtt, rec.accepted,
                                            rec.proactive_hit)
            self.cut.observe_verdict(sent.scores, sent.lookup, verdict.verify_s, rtt, list(verdict.path))
        # a round that drafted nothing says nothing of the draft's acceptance (depth 0: ignored)
        self.controller.observe_round(len(verdict.path), observed_depth(depth, left) if p_drafts else max(depth, 1),
                                      rec.cloud_s, decision.b_hat)
        if self.policy.cost_aware:  # the only controller that prices the lookup chains
            self.controller.observe_lookup(*d.lookup_outlook())
        # settled on the freshest acceptance, knowing the levels the kept branch supplies
        return plan.emitted, self.controller.next_depth(self.policy.proactive, d.levels)


@dataclass(slots=True)
class _Ahead:
    """Round 0's tree, drafted on a worker while the cloud prefills the prompt."""
    decision: CAACDecision  # the controller's first decision of the request
    depth: int  # the levels drafted (round_depth of the decision before Ready)
    steps: int = 0  # draft steps run
    prefill_s: float = 0.0  # the draft's prompt prefill before them
    draft_s: float = 0.0  # drafting the tree
    t_done: float = 0.0  # when the tree was ready (the coordinator's clock)


@dataclass(slots=True, frozen=True)
class SentTree:
    """What the send cut learns from a sent tree: per node (index on the wire)."""
    scores: list[float] = field(default_factory=list)  # [nodes] cumulative draft log-probability
    lookup: list[bool] = field(default_factory=list)  # [nodes] on a prompt-lookup chain


def _fill_decision(rec: RoundRecord, dec: CAACDecision) -> None:
    rec.tau_cur, rec.tau_fast, rec.tau_slow = dec.tau_cur, dec.tau_fast, dec.tau_slow
    rec.esr, rec.eta, rec.acceptance, rec.b_hat = dec.esr, dec.eta, dec.acceptance, dec.b_hat
