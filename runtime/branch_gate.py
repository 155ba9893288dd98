"""Whether the proactive branch starts its next expansion step (interruptible policies), pure.

IPDG reads the cloud's feedback only between complete steps, so a step started shortly before
the verdict lands runs past it. On a slow edge (a step ~0.3-1x of the verify: the PyTorch draft
on a CPU) that overrun is most of a step on the critical path of every round whose branch
misses. Starting a step at ``t`` (seconds since the tree was sent) that takes ``s``, with the
verdict expected at ``T``:

    the branch is kept (p):   the step's work is reused; it overlapped the wait by  T - t
    the branch is dropped:    the next round starts  t + s - T  later than it could have

    start  iff  t + s <= T   or   (p (T - t) >= (1 - p) (t + s - T)   and not may_end)

``T`` = EMA of the send → verdict time (the cloud's share: RTT + verify), ``s`` = EMA of the
branch's own step seconds (contended, as measured), ``p`` = EMA of how often this session's
verdicts landed on a root that the branch has fed once this step is done (prior ``prior``
until one is seen). Roots come in two waves (``Drafter.proactive_steps``): the first step feeds
the outcomes known before it (a verdict stopping inside D_i), the second the outcomes at D_i's
leaves, known once the first step has fed them. So the first step's ``p`` counts the first wave
only, a later step's both: a first step whose own roots are rarely right does not run past the
verdict on the strength of roots only a second step would feed (on a slow edge under load, with
three roots, that overran every round by ~30 ms and kept nothing). A branch stopped before its
first step is judged too, on its first wave (chosen before the gate is asked): otherwise a few
early misses would close the gate for good, with nothing left to reopen it. Once ``t >= T`` (the verdict
is overdue) the overlap term is 0, so only a certain branch (p = 1) starts another step. Until a
cloud time and a step time are known every step starts (the paper's IPDG).

The gate is carried from one request to the next with the depth controller (``CAAC.gate``), as the
controller's latency baseline is: ``s`` is this device's, ``T`` this link's and ``p`` this pair's.
A gate made afresh for every request started every step of its first rounds on "unknown", then
bet on the prior: on the slow edge under load that was 2 branch steps a request on average, each
~70 ms past the verdict, none kept (``bench-out/zen4-slow-onewave``, ipdg: 31 started in 120
rounds, 15 of them in a request's first round, 0 kept).

The second wave costs the first step rows: D_i's unfed leaves (and any lookup chain below them,
fed whole) ride in it so that their next tokens become known. Where a second step cannot end
before the verdict, those rows buy nothing and lengthen the one step that can count:

    second wave  iff  costs unknown   or   t + 2 s <= T

so on a slow edge (a step ~0.6-1.2x the wait) the first step feeds the first wave's roots alone.

A round that drafted nothing feeds its pending tokens in the wait (``Coordinator._catch_up``):
that work is never discarded, and it keeps the controller's slowdown measured while nothing is
drafted, but a step that runs past the verdict delays a next round that may draft nothing
either. So it runs where it should end in time by its own measured seconds (``catch_s``, the
branch's ``step_s`` until one is measured), and otherwise once in ``CATCH_UP_EVERY`` rounds, which
keeps ``catch_s`` and the slowdown current (a load that lifts is seen within 4 rounds):

    catch up  iff  costs unknown   or   t + catch_s <= T
                   or   (the last CATCH_UP_EVERY - 1 were skipped   and not may_end)

Judged by the branch's steps alone, the catch-ups of rapid-cost's undrafted rounds under a
sustained load ran in 248 of 461 rounds, each ~0.39 s against a ~0.29 s wait, and each such
round waited 0.10 s past its verdict (Xeon with AMX, five prompts a set, ``amx-sustained-n5``).

A verdict that may end the generation (its tree reaches the last token the request asks for:
``may_end``) leaves nothing for a kept branch or a fed token to serve if it does, so such a
round bets on nothing: a step starts only where it should end before the verdict, and no
catch-up is forced (the next round, if any, forces it). The bench's short replies met this
once a reply: the forced catch-ups of rapid-cost's last rounds under sustained load fed ~20
pending tokens in 0.45-0.66 s against a ~0.3 s wait, after which the request was over
(``amx-sustained-n5-catch``, oasst: 0.15-0.36 s of 2.7-3.3 s a reply).

Only when a step starts, and what the first step feeds, change: no step starts after the feedback
flag, a started step always completes, and the verdict is reconciled as before, so the tokens are
the target's whatever the gate decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WAVES = 2  # root waves: fed by the first branch step (0), by a later one (1)
CATCH_UP_EVERY = 4  # a catch-up that should overrun the verdict still runs once in this many rounds


@dataclass(slots=True)
class BranchGate:
    alpha: float = 0.3  # EMA rate of the three estimates
    prior: float = 0.3  # P(kept) before a branch has been judged
    cloud_s: float = 0.0  # EMA send → verdict (0: unknown)
    step_s: float = 0.0  # EMA of a branch step (0: unknown)
    p_kept: list[float] = field(default_factory=lambda: [-1.0] * WAVES)  # per wave: EMA of a verdict landing on
    # a root of that wave or an earlier one (< 0: none yet, the prior is used)
    catch_s: float = 0.0  # EMA of a catch-up step (0: unknown; the branch's step stands in)
    skipped: int = 0  # catch-ups skipped in a row

    def __post_init__(self) -> None:
        if not (0.0 < self.alpha <= 1.0 and 0.0 <= self.prior <= 1.0):
            raise ValueError(f"need alpha in (0, 1] and prior in [0, 1], got {self.alpha}, {self.prior}")

    def _ema(self, old: float, new: float) -> float:
        return new if old <= 0.0 else old + self.alpha * (new - old)

    def observe_cloud(self, seconds: float) -> None:
        """One send → verdict time."""
        if seconds > 0.0:
            self.cloud_s = self._ema(self.cloud_s, seconds)

    def observe_step(self, seconds: float) -> None:
        """One complete branch step."""
        if seconds > 0.0:
            self.step_s = self._ema(self.step_s, seconds)

    def observe_kept(self, landed: int | None, waves: int = WAVES) -> None:
        """A branch was judged: the verdict landed on a root of wave ``landed`` (0: fed by the
        first step, 1: by a later one), or on none (None). ``waves``: how many waves had their
        roots chosen (1 when the branch was stopped before its first step, which chooses the
        second wave); only those waves learn."""
        for wave, old in enumerate(self.p_kept[:waves]):
            x = 1.0 if landed is not None and landed <= wave else 0.0
            self.p_kept[wave] = x if old < 0.0 else old + self.alpha * (x - old)

    def p(self, step: int = 1) -> float:
        """P(kept) for a branch whose step ``step`` (0 = the first) is done."""
        old = self.p_kept[min(max(step, 0), WAVES - 1)]
        return self.prior if old < 0.0 else old

    def second_wave(self, elapsed_s: float) -> bool:
        """Could a branch begun ``elapsed_s`` seconds after the send end its second step before the
        verdict? (module docstring; True while a cost is unknown)"""
        if self.cloud_s <= 0.0 or self.step_s <= 0.0:
            return True
        return elapsed_s + 2.0 * self.step_s <= self.cloud_s

    def observe_catch_up(self, seconds: float) -> None:
        """One complete catch-up step (``Coordinator._catch_up``)."""
        if seconds > 0.0:
            self.catch_s = self._ema(self.catch_s, seconds)

    def catch_up(self, elapsed_s: float, may_end: bool = False) -> bool:
        """Feed the pending tokens of a round that drafted nothing, ``elapsed_s`` seconds after the
        send? (module docstring: where the catch-up step should end before the verdict, and else
        once in ``CATCH_UP_EVERY`` rounds unless the verdict ``may_end`` the generation; True while
        a cost is unknown)."""
        est = self.catch_s if self.catch_s > 0.0 else self.step_s
        fits = self.cloud_s <= 0.0 or est <= 0.0 or elapsed_s + est <= self.cloud_s
        if fits or (self.skipped >= CATCH_UP_EVERY - 1 and not may_end):
            self.skipped = 0
            return True
        self.skipped += 1
        return False

    def start(self, elapsed_s: float, step: int = 1, may_end: bool = False) -> bool:
        """Start branch step ``step`` (0 = the first) ``elapsed_s`` seconds after the send, the
        verdict perhaps ending the generation (``may_end``)? (module docstring)"""
        if self.cloud_s <= 0.0 or self.step_s <= 0.0:
            return True
        t, s, big_t, p = elapsed_s, self.step_s, self.cloud_s, self.p(step)
        if t + s <= big_t:
            return True
        return not may_end and p * max(0.0, big_t - t) >= (1.0 - p) * (t + s - big_t)
