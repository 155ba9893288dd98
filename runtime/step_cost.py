"""The uncontended cost of one draft expansion step, by the number of tokens it feeds.

A step feeds ``T`` tokens: the prefill (the prompt), the pending tokens after a verdict (1 or
2), the proactive root b* (1), frontier steps (up to ``width``). What a step costs as a function
of ``T`` depends on the machine: about the same whatever ``T`` on a GPU or a Jetson (launch and
weight reads dominate), linear in ``T`` on a float32 CPU, flat and then rising on a bf16 CPU
(oneDNN computes up to ~8 rows for the price of one). A per-token time (``seconds / T``) is
therefore not a machine speed: on a GPU it halves when ``T`` doubles. CAAC compares each step
with the baseline of ITS OWN size instead:

    tau_hat(T) = the baseline seconds of a step of exactly T tokens (one class per T)

    first step of class T:  tau_hat(T) = seconds / esr          (esr = CAAC's current ESR)
    later steps:            tau_hat(T) <- tau_hat(T) + w * (seconds - tau_hat(T))
                            w = max(1 / n_T, rate)               n_T = steps seen in class T
                            (rate = alpha_slow in the normal band, alpha_slow_hold above it;
                             above the band the class is not averaged, only w = alpha_slow_hold)

No curve is assumed, so every cost curve is fitted exactly; a class warms up as a running mean
of its own samples (its baseline error falls as 1/sqrt(n_T)). A new class starts at its first
sample de-rated by the current slowdown, so it reads ``seconds / tau_hat(T) = esr``: it neither
raises nor lowers the ESR, and a class first seen under load does not take the load as its
baseline. At most ``max_classes`` classes are kept (least recently seen dropped): prefills of
every prompt length would otherwise grow the table without bound.

:class:`Slowdown` is CAAC's physical path over that table (``c`` = the CAACConfig)::

    s    = max(seconds, tau_floor * T);   r = s / tau_hat(T)     # this step's slowdown
    ESR  = 1                                 while steps < n_warmup
    ESR <- ESR + alpha_fast * (r - ESR)      afterwards (a new class reads r = ESR: unchanged)
    tau_hat(T) updated as above with rate = alpha_slow      if steps < n_warmup or ESR <= band_hi
                                            alpha_slow_hold otherwise (hysteresis: near-frozen)

``slow_run`` counts the steps of a known size in a row each slower than ``band_hi`` times their
own baseline (a new class counts neither way): one spike moves the ESR, a run says the edge is
slowed (rapid-cost's depth 0, ``rapid.runtime.cost_caac``).

A step that runs while the cloud verifies (a proactive branch step, a catch-up step) is compared
with its own table, ``beside``: where edge and cloud share a host (and its memory bandwidth) it
runs slower than a step of the same size alone, with or without a load (a Zen 3 slow edge:
catch-up steps 0.333 s against 0.247 s for the drafting steps under a sustained load, 0.156
against 0.123 without one). Read against the drafting steps' baselines, that co-location read as
contention: rapid-cost drafting nothing under load fed only catch-up steps, its ESR climbed from
2.2 to 3.1, a draft step was priced at 0.34 s instead of ~0.25, and depth 0 held whole
generations where ``rapid``'s depth 1 ran 1.2x faster (``bench-out/zen3-slow2``, wikitext). The
ESR is one EMA over both kinds (each against its own kind); the drafting steps' table alone
prices a step on the critical path (``Slowdown.baseline``).

Telemetry: ``tau_cur`` = s of the last step, ``tau_fast`` = EMA(s) and ``tau_slow`` =
EMA(tau_hat(T)) over the same steps (both at ``alpha_fast``, seconds per step), so ``ESR ~=
tau_fast / tau_slow``; ``tau_fast`` is also the time cap's seconds per step.

Pure: no clocks, no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rapid.runtime.caac import CAACConfig

__all__ = ["Slowdown", "StepBaseline"]


class StepBaseline:
    """``tau_hat(T)`` per tokens-per-step class; see the module docstring."""

    __slots__ = ("max_classes", "_base", "_count")

    def __init__(self, max_classes: int = 32) -> None:
        if isinstance(max_classes, bool) or not isinstance(max_classes, int) or max_classes < 1:
            raise ValueError(f"max_classes must be an int >= 1, got {max_classes!r}")
        self.max_classes = max_classes
        self._base: dict[int, float] = {}  # T -> tau_hat(T), least recently seen first
        self._count: dict[int, int] = {}  # T -> n_T

    def __len__(self) -> int:
        return len(self._base)

    def predict(self, tokens: int) -> float | None:
        """``tau_hat(tokens)``, or None for a class not seen (or dropped)."""
        return self._base.get(tokens)

    def count(self, tokens: int) -> int:
        return self._count.get(tokens, 0)

    def start(self, tokens: int, seconds: float, esr: float) -> float:
        """Open class ``tokens`` at ``seconds / esr`` (its first step); return that baseline."""
        self._base[tokens] = seconds / esr
        self._count[tokens] = 1
        while len(self._base) > self.max_classes:
            oldest = next(iter(self._base))
            del self._base[oldest], self._count[oldest]
        return self._base[tokens]

    def update(self, tokens: int, seconds: float, rate: float, average: bool) -> None:
        """Move an existing class towards ``seconds``: ``w = max(1/n_T, rate)`` when ``average``
        (normal band or warm-up), else ``w = rate``; marks the class most recently seen."""
        n = self._count.pop(tokens) + 1
        base = self._base.pop(tokens)
        w = max(1.0 / n, rate) if average else rate
        self._base[tokens] = base + w * (seconds - base)
        self._count[tokens] = n

    def classes(self) -> dict[int, float]:
        """A copy of the table ``{T: tau_hat(T)}`` (telemetry)."""
        return dict(self._base)


class Slowdown:
    """CAAC's physical path: the slowdown ratio ESR over per-size step baselines (see above).
    Takes validated inputs (CAAC applies the input guards)."""

    def __init__(self, config: CAACConfig) -> None:
        self.config = config
        self.baseline = StepBaseline(config.max_classes)  # steps alone (the critical path's)
        self.beside = StepBaseline(config.max_classes)  # steps run while the cloud verifies
        self.steps = 0
        self.esr = 1.0
        self.tau_cur = self.tau_fast = self.tau_slow = 0.0
        self.tokens_per_step = 0.0
        self.slow_run = 0  # steps of a known size in a row, each over band_hi times its own baseline

    def observe(self, seconds: float, tokens: int, beside: bool = False) -> None:
        """One complete step of ``tokens`` tokens that took ``seconds`` (> 0, finite); ``beside``:
        it ran while the cloud verified (compared with that table)."""
        c = self.config
        s = max(seconds, c.tau_floor * tokens)
        table = self.beside if beside else self.baseline
        base = table.predict(tokens)
        new_class = base is None
        if base is None:  # reads r = ESR: a new class neither raises nor lowers the slowdown
            base = max(table.start(tokens, s, self.esr), c.tau_floor * tokens)
        self.tau_cur = s
        if self.steps == 0:
            self.tau_fast, self.tau_slow, self.tokens_per_step = s, base, float(tokens)
        else:
            self.tau_fast += c.alpha_fast * (s - self.tau_fast)
            self.tau_slow += c.alpha_fast * (base - self.tau_slow)
            self.tokens_per_step += c.alpha_fast * (tokens - self.tokens_per_step)
        warm = self.steps < c.n_warmup
        if not new_class:
            self.slow_run = self.slow_run + 1 if s > c.band_hi * base else 0
            if not warm:
                self.esr += c.alpha_fast * (s / base - self.esr)
            average = warm or self.esr <= c.band_hi
            table.update(tokens, s, c.alpha_slow if average else c.alpha_slow_hold, average)
        self.steps += 1
