"""The simulator's proactive branch (``rapid.bench.sim``): what one round's branch costs and whether
it is kept, drafted as the runtime drafts it. Interruptible policies ask the runtime's
``BranchGate`` before each step and stop at the first step boundary after the verdict; the others
run their planned (or traced) steps whatever the verdict. A round that drafted nothing after
another feeds its pending tokens in the wait instead (``run_catch_up``). ``e`` is the simulator's
edge state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from rapid.bench.beside_fit import CATCH_UP
from rapid.bench.colocation import overlap_as_it_grows
from rapid.runtime.branch_gate import WAVES


@dataclass(slots=True)
class VerifyWindow:
    """The verify in flight while the edge steps: [start, end], and the co-location tax (the
    bench's one host: ``Calibration.step_tax`` seconds of verify per second of step beside it;
    0 for a cloud elsewhere or a verify under the contention load, which is taxed as a whole)."""
    start: float
    end: float
    tax: float = 0.0
    grown: float = 0.0  # seconds the steps beside it added (the verdict lands that much later)

    def beside(self, a: float, b: float) -> None:
        """An edge step ran over [a, b]."""
        if self.tax > 0:
            g = self.tax * overlap_as_it_grows(a, b, self.start, self.end, self.tax)
            self.end += g
            self.grown += g


def draw_count(rng: random.Random, mean: float) -> int:
    """A whole count whose expectation is ``mean``: floor(mean), plus one with P = its fraction."""
    return int(mean) + (rng.random() < mean - int(mean))


def run_branch(e, t_send: float, t_arr: float, a: int, depth: int, landed: int | None,
               window: VerifyWindow, may_end: bool = False) -> tuple[float, bool]:
    """The proactive branch drafted from ``t_send``: interruptible policies ask the runtime's
    ``BranchGate`` before each step and stop at the first step boundary after the verdict
    (``t_arr``, plus what each step beside the verify added to it: ``window``). ``landed``: the
    root wave the verdict lands on (None: no root). Returns when the edge is free for the next
    round, and whether the branch was kept (a landed root with a step run). ``may_end``: the
    verdict may end the generation (the gate then starts no step that would outlast it)."""
    pol = e.policy
    hit = landed is not None
    gated = pol.interruptible and not e.oracle  # the oracle stops its planned branch by itself
    if e.load_oracle:
        want = e.load_aware_depth(t_send)
    elif not e.oracle:
        want = e.ctrl.next_depth_if(a, max(depth, 1), e.decision.b_hat, True).depth
    else:
        want = e.oracle_branch  # the planned branch length
    levels = want  # the levels the branch aims at: all a kept branch supplies
    if not pol.interruptible and pol.name in e.cal.branch_steps_by_policy and not e.oracle:
        # as traced: it runs them all, whatever the verdict
        want = draw_count(e.rng, e.cal.branch_steps_by_policy[pol.name])
    elif not e.oracle:  # the runtime runs until its root has them (Coordinator._branch)
        want = e.cal.steps_for(levels, pol.name)
    waves = WAVES if not gated or e.gate.second_wave(0.0) else 1  # as the coordinator
    if landed is not None and landed >= waves:  # a leaf's outcome: no root of its wave was chosen
        landed, hit = None, False
    t, steps, stopped = t_send, 0, None
    # a chain step feeds one token: tau · scale(1); a tree step as traced beside the verify, else
    # tokens_per_step (rapid.bench.beside_fit)
    chain = pol.chain_branch or e.oracle
    per_step = 1 if chain else e.cal.beside.step_tokens(pol.name, e.cal.step_tokens)
    scale = e.cal.step_scale(1) if chain else e.cal.beside.scale(pol.name, e.cal.step_scale, e.cal.step_tokens)
    while steps < want:
        if pol.interruptible and t >= t_arr + window.grown:
            break
        if gated and not e.gate.start(t - t_send, min(steps, waves - 1), may_end):
            break
        d = e.step_time(t) * scale
        window.beside(t, t + d)
        t += d
        steps += 1
        e.ctrl.observe_step(d, per_step, beside=True)
        e.gate.observe_step(d)
        if pol.interruptible and t >= t_arr + window.grown:
            stopped = steps
            break
    t_arr += window.grown
    if gated:
        e.gate.observe_kept(landed, waves if steps else 1)  # as the coordinator: a branch never
        # started, or started without one, has no second wave
        e.gate.observe_cloud(t_arr - t_send)
    kept = hit and steps > 0
    e.res.branches += 1
    e.res.interrupts += stopped is not None
    if kept:
        e.res.hits += 1
        # the levels it supplies: as traced for its steps (a tree branch's roots share them)
        e.reused = min(steps, levels) if e.oracle else draw_count(e.rng, e.cal.reused(steps, levels, pol.name))
    else:
        e.res.discarded += steps
    e.res.draft_steps += steps
    return max(t_arr, t), kept


def run_catch_up(e, t_send: float, t_arr: float, window: VerifyWindow, may_end: bool = False) -> float:
    """A proactive policy's round that drafted nothing, after another such round (two tokens
    pending): one step (as traced beside the verify, else of one token) from ``t_send`` if the
    runtime's ``BranchGate.catch_up`` says so (it should end before the verdict, else once in a
    few rounds unless the verdict ``may_end`` the generation), measured by the controller and the
    gate (``Coordinator._catch_up``), beside the verify (``window``). Returns when the edge is free
    for the next round."""
    if not e.gate.catch_up(0.0, may_end):
        return t_arr
    d = e.step_time(t_send) * e.cal.beside.scale(CATCH_UP, e.cal.step_scale, 1)
    e.gate.observe_catch_up(d)
    window.beside(t_send, t_send + d)
    e.ctrl.observe_step(d, e.cal.beside.step_tokens(CATCH_UP, 1), beside=True)
    return max(t_arr + window.grown, t_send + d)
