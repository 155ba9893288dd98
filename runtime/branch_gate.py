"""Whether the proactive branch starts its next expansion step (interruptible policies), pure.

IPDG reads the cloud's feedback only between complete steps, so a step started shortly before
the verdict lands runs past it. On a slow edge (a step ~0.3-1x of the verify: the PyTorch draft
on a CPU) that overrun is most of a step on the critical path of every round whose branch
misses. Starting a step at ``t`` (seconds since the tree was sent) that takes ``s``, with the
verdict expected at ``T``:

    the branch is kept (p):   the step's work is reused; it overlapped the wait by  T - t
    the branch is dropped:    the next round starts  t + s - T  later than it could have

    start  iff  t + s <= T   or   p (T - t) >= (1 - p) (t + s - T)

``T`` = EMA of the send → verdict time (the cloud's share: RTT + verify), ``s`` = EMA of the
branch's own step seconds (contended, as measured), ``p`` = EMA of the kept rate of this
session's branches (prior ``prior`` until one is seen). Once ``t >= T`` (the verdict is
overdue) the overlap term is 0, so only a certain branch (p = 1) starts another step. Until a
cloud time and a step time are known every step starts (the paper's IPDG).

Only when a step starts changes: no step starts after the feedback flag, a started step always
completes, and the verdict is reconciled as before, so the tokens are the target's whatever the
gate decides.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class BranchGate:
    alpha: float = 0.3  # EMA rate of the three estimates
    prior: float = 0.3  # P(kept) before a branch has been judged
    cloud_s: float = 0.0  # EMA send → verdict (0: unknown)
    step_s: float = 0.0  # EMA of a branch step (0: unknown)
    p_kept: float = -1.0  # EMA of the kept rate (< 0: none yet, the prior is used)

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

    def observe_kept(self, kept: bool) -> None:
        """A branch was judged: kept (hit) or dropped."""
        x = 1.0 if kept else 0.0
        self.p_kept = x if self.p_kept < 0.0 else self.p_kept + self.alpha * (x - self.p_kept)

    @property
    def p(self) -> float:
        return self.prior if self.p_kept < 0.0 else self.p_kept

    def start(self, elapsed_s: float) -> bool:
        """Start the next step ``elapsed_s`` seconds after the send? (module docstring)"""
        if self.cloud_s <= 0.0 or self.step_s <= 0.0:
            return True
        t, s, big_t, p = elapsed_s, self.step_s, self.cloud_s, self.p
        if t + s <= big_t:
            return True
        return p * max(0.0, big_t - t) >= (1.0 - p) * (t + s - big_t)
