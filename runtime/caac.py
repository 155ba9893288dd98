"""CAAC: congestion-aware adaptive controller for the speculative draft depth.

Each round the edge drafts a token tree of depth ``L`` (``L`` expansion steps, each feeding
``T`` tokens to the draft model); the cloud answers with the accepted length ``a`` in
``0..L``. CAAC picks ``L`` for the next round from a physical and a logical path. It is
pure: no clocks, no I/O. The caller measures durations and passes them in.

Control law (``c`` = :class:`CAACConfig`; ``L_base`` = ``initial_depth``)
----------------------------------------------------------------------------
Physical path, per expansion step (``observe_step(seconds, tokens)``; the formulas of
``ESR`` and of the per-size step baselines ``tau_hat(T)`` are in :mod:`rapid.runtime.step_cost`)::

    r   = max(seconds, tau_floor * T) / tau_hat(T)    # slowdown against a step of the same size
    ESR = EMA(r) at alpha_fast (1 while steps < n_warmup); tau_hat(T) held above band_hi
    eta = 1                                            if steps < n_warmup or ESR <= band_hi
        = clamp((band_hi / ESR) ** gamma, eta_min, 1)  otherwise

A change of step size is not a slowdown: tokens per step vary inside every round (prefill, 1-2
pending tokens, the root b*, frontier steps of up to ``width``), and on a GPU, a Jetson or a
bf16 CPU a step costs about the same whatever its size, so seconds per token swing ``width``-fold
within a round.

``eta`` is continuous at ``band_hi``; with ``gamma = 1`` it keeps ``L * s`` (the drafting time
per round) roughly constant above the band. Baseline absorption: under a sustained slowdown
``x = s_after / s_before`` each class moves at ``alpha_slow_hold`` until ESR re-enters the
band, which takes ``n = ln((x - 1) / (x * (1 - 1/band_hi))) / -ln(1 - alpha_slow_hold)``
steps of that class, never more than ``ln(band_hi / (band_hi - 1)) / alpha_slow_hold`` (~1800
with the defaults; ~1100 for ``x = 2``, ~275 rounds of 4 steps, tens of seconds at 20-50 ms per
step). From then on ``eta = 1``: a permanent change of machine is punished for a bounded time,
while a contention episode shorter than that keeps the gate closed. Slow drifts that stay
inside the band (a growing context) are followed at ``alpha_slow``.

Logical path, per round (``observe_round(accepted, depth, cloud_seconds, b_hat)``)::

    no sample from a request's first verdict or if accepted > depth    # see below
    A   <- A + alpha_acc * (accepted / depth - A)             # A starts at target
    e    = A - target_acceptance;   de = e - e_prev
    I   <- I + e     unless (conditional integration) depth != round(B_hat), or
                     e > 0 and B_raw >= max_depth, or e < 0 and B_raw <= min_depth;
                     then I is clamped to
                     [(min_depth - L_base) / ki, (max_depth - L_base) / ki]      # anti-windup
    B_raw = L_base + kp * e + ki * I + kd * de;     B_hat = clamp(B_raw, min_depth, max_depth)

(``B_raw`` in the saturation test uses the new P and D terms and the old I; ``B_hat`` in the
``depth`` test is the one behind the decision that set this round's depth: the caller passes
``decision.b_hat``; without it, the value before this update, which is that one when every
decision is taken right after the previous ``observe_round``.)
The ``depth != round(B_hat)`` clause freezes the integral when the executed depth was cut
(by ``eta``, the time cap or the caller): shallower trees are accepted at a higher ratio, and
integrating that would teach the logical loop to undo the physical throttling. It is
symmetric so that noisy rounds at a cut depth cannot bias I either way; the P and D terms
still respond to them (with a chain plant they push back by a fraction of a step). Depths
are integers, so when no depth gives exactly ``A*`` the loop dithers between neighbours.
Two verdicts take no sample. A request's first: it tests the reply's first token, which the
draft gets right far less often than the rest and which says little of them
(``scripts/first_position.py``, two samples of 50 prompts of the five bench sets, the default
pair: top-1 agreement 0.52 at the first position, 0.81 / 0.73 at the next eleven, and there
0.81 / 0.77 after a right first against 0.80 / 0.68 after a wrong one): a biased sample, which
the PID answers with depth 3 when it is 0. And a round accepted past its drafted depth: only a
prompt-lookup chain (``rapid.runtime.lookup``) reaches below the drafted levels, so the chain,
not the draft, set that round's length, and a deeper draft would only have repeated the chain's
tokens. Counted as full (the paper's ``min(accepted, depth)``), such rounds drove the depth up
wherever the text copies the prompt, one draft step a level for nothing (slow edge, oasst:
depth 5 against 4).

Fusion and time cap (``next_depth(proactive)``)::

    L = clamp(round_half_up(eta * B_hat), min_depth, max_depth)
    if proactive and time_cap and cloud EMA known:        # separate, switchable step
        C = EMA(cloud_seconds) with alpha_cloud
        L = min(L, max(min_depth, floor(C / tau_fast)))       # tau_fast: seconds per step now

With proactive drafting the edge drafts the next tree while the cloud verifies, so drafting
longer than one cloud response (RTT + verify) makes the edge the bottleneck.

Input guards: a step with non-finite / non-positive ``seconds``, ``seconds > max_seconds``
(non-physical, e.g. the process was suspended) or ``tokens < 1`` is ignored; so is a round
with ``depth < 1``, ``accepted < 0`` or non-integral values, and a ``cloud_seconds`` that fails
the duration test. Ignored inputs are counted in
:meth:`CAAC.snapshot`. Every output is finite and the depth stays in [min_depth, max_depth].

Defaults (the test scenarios in tests/runtime/test_caac.py and test_caac_devices.py are the
calibration): alpha_fast=0.5 (an ``x``-fold slowdown reads ESR = 1 + (x - 1)(1 - (1 -
alpha_fast)^k) after k steps: a 2x slowdown closes the gate after one step, and after it ends
the gate reopens after 3 steps ((1 - alpha_fast)^3 = 0.125 <= (band_hi - 1) / (x - 1) = 0.2),
i.e. within 3 rounds even at depth 1; 0.3 needs 5. In the band ESR's noise is sigma * sqrt(
alpha_fast / (2 - alpha_fast)) = 0.58 sigma for a per-step jitter sigma: 10 % jitter puts band_hi
3.5 sigma away), alpha_slow=0.01 (a class averages its first 100 steps, then a ~100-step EMA in
the band), alpha_slow_hold=0.001 (bounds absorption as above; after 50 rounds of a 2x slowdown
ESR is still ~1.7), n_warmup=8 (two rounds of 4), band_hi=1.2 (jitter of a shared edge CPU/GPU
stays below 20 %), gamma=1 (keep draft time per round constant), eta_min=0.25 (never cut below
a quarter), max_classes=32 (the step sizes of a round are 1..width plus the prefills of recent
prompts), alpha_acc=0.3 (acceptance memory of ~3 rounds), target_acceptance=0.65 (for per-token
acceptance p the depth settles where the deepest drafted token still has ~45-50 % acceptance),
kp=4 (all accepted: +1.4, none accepted: -2.6 depth immediately), ki=0.75 (all accepted reaches
depth 8 in ~11 rounds; 0.5 dithers over 6-8 at p = 0.9), kd=0.5 (mild damping of the acceptance
EMA), alpha_cloud=0.3 (RTT jitter smoothed over ~3 rounds), tau_floor=1e-9 s/token and
max_seconds=3600 (physical limits, only guard against garbage), min/max_depth=1/8.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

from rapid.runtime.branch_gate import BranchGate
from rapid.runtime.depth_control import CAACDecision, carried_by_chain
from rapid.runtime.step_cost import Slowdown

__all__ = ["CAAC", "CAACConfig", "FixedDepth"]

_INT_FIELDS = ("min_depth", "max_depth", "n_warmup", "max_classes")


@dataclass(slots=True, frozen=True)
class CAACConfig:
    """Every constant of the control law (see the module docstring for the formulas)."""

    min_depth: int = 1  # lowest depth ever returned
    max_depth: int = 8  # highest depth ever returned
    alpha_fast: float = 0.5  # EMA rate of ESR (and of tau_fast, tau_slow, tokens per step)
    alpha_slow: float = 0.01  # rate of each class baseline tau_hat(T) while ESR <= band_hi
    alpha_slow_hold: float = 0.001  # baseline rate while ESR > band_hi (hysteresis)
    n_warmup: int = 8  # steps before the gate may act; ESR stays 1 until then
    max_classes: int = 32  # tokens-per-step classes kept by the step baseline
    band_hi: float = 1.2  # top of the normal ESR band (eta = 1 inside)
    gamma: float = 1.0  # gate exponent: eta = (band_hi / ESR) ** gamma above the band
    eta_min: float = 0.25  # floor of the gate
    tau_floor: float = 1e-9  # s/token; a step of T tokens counts at least tau_floor * T seconds
    max_seconds: float = 3600.0  # durations above this are ignored as non-physical
    alpha_acc: float = 0.3  # EMA rate of the acceptance ratio accepted / depth
    target_acceptance: float = 0.65  # PID set point A*
    kp: float = 4.0  # proportional gain (depth per unit acceptance error)
    ki: float = 0.75  # integral gain (depth per unit error per round)
    kd: float = 0.5  # derivative gain (depth per unit error change per round)
    alpha_cloud: float = 0.3  # EMA rate of the cloud response time (RTT + verify)
    time_cap: bool = True  # apply the time-budget cap when next_depth(proactive=True)

    def __post_init__(self) -> None:
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "time_cap":
                if not isinstance(v, bool):
                    raise ValueError(f"CAACConfig.time_cap must be a bool, got {v!r}")
                continue
            if f.name in _INT_FIELDS:
                if isinstance(v, bool) or not isinstance(v, int):
                    raise ValueError(f"CAACConfig.{f.name} must be an int, got {v!r}")
            elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"CAACConfig.{f.name} must be a finite number, got {v!r}")

        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise ValueError(f"CAACConfig: {msg}")

        need(1 <= self.min_depth <= self.max_depth,
             f"need 1 <= min_depth <= max_depth, got {self.min_depth}, {self.max_depth}")
        need(0 < self.alpha_slow_hold <= self.alpha_slow < self.alpha_fast <= 1,
             "need 0 < alpha_slow_hold <= alpha_slow < alpha_fast <= 1, got "
             f"{self.alpha_slow_hold}, {self.alpha_slow}, {self.alpha_fast}")
        need(self.n_warmup >= 0, f"n_warmup must be >= 0, got {self.n_warmup}")
        need(self.max_classes >= 1, f"max_classes must be >= 1, got {self.max_classes}")
        need(self.band_hi >= 1, f"band_hi must be >= 1, got {self.band_hi}")
        need(self.gamma > 0, f"gamma must be > 0, got {self.gamma}")
        need(0 < self.eta_min <= 1, f"eta_min must be in (0, 1], got {self.eta_min}")
        need(self.tau_floor > 0, f"tau_floor must be > 0, got {self.tau_floor}")
        need(self.max_seconds > self.tau_floor,
             f"max_seconds must be > tau_floor, got {self.max_seconds}")
        need(0 < self.alpha_acc <= 1, f"alpha_acc must be in (0, 1], got {self.alpha_acc}")
        need(0 < self.target_acceptance < 1,
             f"target_acceptance must be in (0, 1), got {self.target_acceptance}")
        for name in ("kp", "ki", "kd"):
            need(getattr(self, name) >= 0, f"{name} must be >= 0, got {getattr(self, name)}")
        need(0 < self.alpha_cloud <= 1, f"alpha_cloud must be in (0, 1], got {self.alpha_cloud}")


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5)


def _as_int(x: object) -> int | None:
    """``x`` as an int if it is an integral finite number (bools rejected), else None."""
    if isinstance(x, bool):
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and math.isfinite(x) and x.is_integer():
        return int(x)
    try:  # numpy integers and the like
        return int(x.__index__())  # type: ignore[attr-defined]
    except (AttributeError, TypeError):
        return None


class CAAC:
    """Congestion-aware adaptive depth controller; see the module docstring."""

    def __init__(self, config: CAACConfig | None = None, initial_depth: int = 4):
        self.config = config if config is not None else CAACConfig()
        c = self.config
        d = _as_int(initial_depth)
        if d is None or not c.min_depth <= d <= c.max_depth:
            raise ValueError(f"initial_depth must be an int in [{c.min_depth}, "
                             f"{c.max_depth}], got {initial_depth!r}")
        self.base_depth = d
        self._phys = Slowdown(c)  # the physical path (runtime.step_cost)
        self._rounds = 0
        self._acc = c.target_acceptance
        self._err = 0.0
        self._d_err = 0.0
        self._integral = 0.0
        self._cloud = 0.0  # 0 = no measurement yet
        self._ignored_steps = 0
        self._ignored_rounds = 0
        self._verdicts = 0  # valid verdicts of this request
        self._unsampled_rounds = 0  # valid verdicts that took no acceptance sample (docstring)
        # the proactive branch's gate (runtime.branch_gate) rides with the controller: its step and
        # cloud times are this device's and this link's, its P(kept) this pair's, so a session's
        # next request starts from them, not from "unknown: start every step" and the prior
        self.gate = BranchGate()

    def _duration_ok(self, seconds: object) -> bool:
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            try:
                seconds = float(seconds)  # type: ignore[arg-type]
            except (TypeError, ValueError):
                return False
        return math.isfinite(seconds) and 0 < seconds <= self.config.max_seconds

    # ---- physical path -------------------------------------------------------------
    def observe_step(self, seconds: float, tokens: int, beside: bool = False) -> None:
        """Record one complete draft expansion step that fed ``tokens`` tokens; ``beside``: it ran
        while the cloud verified (a branch or catch-up step: ``rapid.runtime.step_cost``)."""
        n = _as_int(tokens)
        if n is None or n < 1 or not self._duration_ok(seconds):
            self._ignored_steps += 1
            return
        self._phys.observe(float(seconds), n, bool(beside))

    def _gate(self) -> tuple[float, float]:
        """(esr, eta) from the current physical state."""
        c = self.config
        esr = self._phys.esr
        if self._phys.steps < c.n_warmup or esr <= c.band_hi:
            return esr, 1.0
        return esr, min(1.0, max(c.eta_min, (c.band_hi / esr) ** c.gamma))

    def observe_lookup(self, reach: Sequence[float], nodes: int) -> None:
        """The prompt-lookup chains the next tree would carry (only ``rapid-cost`` prices them)."""

    def new_request(self) -> None:
        """Start a new generation: reset the logical path (acceptance EMA, PID state), keep the
        physical path (ESR, the per-size step baselines, the taus) and the cloud EMA.

        The latency baseline describes the device, not the prompt: a long-lived edge daemon
        that carries it across requests notices contention that began before the request did.
        """
        self._rounds = self._verdicts = 0
        self._acc = self.config.target_acceptance
        self._err = self._d_err = self._integral = 0.0

    # ---- logical path --------------------------------------------------------------
    def _b_raw(self) -> float:
        c = self.config
        return self.base_depth + c.kp * self._err + c.ki * self._integral + c.kd * self._d_err

    def _b_hat(self) -> float:
        c = self.config
        return min(float(c.max_depth), max(float(c.min_depth), self._b_raw()))

    def observe_round(self, accepted: int, depth: int, cloud_seconds: float | None = None,
                      b_hat: float | None = None) -> None:
        """Record one verified round: ``accepted`` of a depth-``depth`` tree; ``b_hat`` is the
        B_hat of the decision that set the depth (for the anti-windup test; default: the current)."""
        c = self.config
        if cloud_seconds is not None and self._duration_ok(cloud_seconds):
            cs = float(cloud_seconds)
            self._cloud = cs if self._cloud == 0.0 else self._cloud + c.alpha_cloud * (
                cs - self._cloud)
        a, d = _as_int(accepted), _as_int(depth)
        if a is None or d is None or a < 0 or d < 1:
            self._ignored_rounds += 1
            return
        if isinstance(b_hat, bool) or not isinstance(b_hat, (int, float)) or not math.isfinite(b_hat):
            b_hat = self._b_hat()
        first = self._verdicts == 0
        self._verdicts += 1
        if first or carried_by_chain(a, d):  # the reply's first token, or a lookup chain's round: no sample
            self._unsampled_rounds += 1
            return
        recommended = _round_half_up(b_hat)  # the logical depth behind this round
        self._acc += c.alpha_acc * (a / d - self._acc)
        e = self._acc - c.target_acceptance
        self._d_err = e - self._err
        self._err = e
        raw = self._b_raw()  # with the new P and D terms, the old integral
        saturated = (e > 0 and raw >= c.max_depth) or (e < 0 and raw <= c.min_depth)
        if d == recommended and not saturated:
            self._integral += e
        if c.ki > 0:
            lo = (c.min_depth - self.base_depth) / c.ki
            hi = (c.max_depth - self.base_depth) / c.ki
            self._integral = min(hi, max(lo, self._integral))
        else:
            self._integral = 0.0
        self._rounds += 1

    # ---- fusion --------------------------------------------------------------------
    def _time_cap(self) -> int | None:
        """The time-budget depth cap, or None while unknown / not binding."""
        c = self.config
        if self._cloud <= 0.0 or self._phys.steps == 0:
            return None
        budget = self._cloud / self._phys.tau_fast
        if not math.isfinite(budget) or budget >= c.max_depth:
            return None
        return max(c.min_depth, math.floor(budget + 1e-9))

    def observe_cloud(self, curve_nodes: Sequence[int], curve_s: Sequence[float], budget: int,
                      width: int) -> None:
        """The cloud's verify curve and the tree shape of a session (used by the cost-aware policy)."""

    def observe_verdict(self, depth: int, nodes: int, verify_s: float, rtt_s: float | None,
                        accepted: int | None = None, hit: bool | None = None) -> None:
        """A verdict's tree size, verify time, RTT and branch outcome (used by the cost-aware policy)."""

    def next_depth(self, proactive: bool = False, reused: int = 0) -> CAACDecision:
        """The depth for the next round (does not change state; ``reused``, the levels a kept
        branch supplies, matters only to the cost-aware policy)."""
        c = self.config
        esr, eta = self._gate()
        b_hat = self._b_hat()
        depth = min(c.max_depth, max(c.min_depth, _round_half_up(eta * b_hat)))
        capped = False
        if proactive and c.time_cap:
            cap = self._time_cap()
            if cap is not None and cap < depth:
                depth, capped = cap, True
        return self._decision(depth, esr, eta, b_hat, capped)

    def next_depth_if(self, accepted: int, depth: int, b_hat: float | None = None,
                      proactive: bool = True) -> CAACDecision:
        """The decision ``next_depth`` would give after ``observe_round(accepted, depth, None,
        b_hat)`` (does not change state): a proactive branch that guessed the verdict knows its
        accepted length before the verdict lands."""
        what_if = copy.copy(self)  # observe_round rebinds plain floats only; the physical path is shared
        what_if.observe_round(accepted, depth, None, b_hat)
        return what_if.next_depth(proactive)

    def _decision(self, depth: int, esr: float, eta: float, b_hat: float,
                  capped: bool) -> CAACDecision:
        ph = self._phys
        return CAACDecision(depth=int(depth), tau_cur=ph.tau_cur, tau_fast=ph.tau_fast,
                            tau_slow=ph.tau_slow, esr=esr, eta=eta, acceptance=self._acc,
                            b_hat=b_hat, capped_by_time=capped)

    def snapshot(self) -> dict:
        """Controller state for telemetry (plain floats / ints / bools)."""
        esr, eta = self._gate()
        cap = self._time_cap()
        return {
            "policy": type(self).__name__,
            "steps": self._phys.steps,
            "rounds": self._rounds,
            "ignored_steps": self._ignored_steps,
            "ignored_rounds": self._ignored_rounds,
            "unsampled_rounds": self._unsampled_rounds,
            "tau_cur": self._phys.tau_cur,
            "tau_fast": self._phys.tau_fast,
            "tau_slow": self._phys.tau_slow,
            "esr": esr,
            "eta": eta,
            "tokens_per_step": self._phys.tokens_per_step,
            "step_classes": len(self._phys.baseline),
            "acceptance": self._acc,
            "error": self._err,
            "integral": self._integral,
            "b_hat": self._b_hat(),
            "cloud_seconds": self._cloud,
            "time_cap_depth": 0 if cap is None else cap,
            "depth": self.next_depth(False).depth,
            "depth_proactive": self.next_depth(True).depth,
        }


class FixedDepth(CAAC):
    """Always returns ``depth``; still records taus and acceptance for telemetry.

    The reported ``eta`` is 1.0 and ``b_hat`` is ``depth`` (nothing is applied); ``esr`` and
    the taus are measured as by CAAC.
    """

    def __init__(self, depth: int = 4, config: CAACConfig | None = None):
        super().__init__(config, initial_depth=depth)
        self.depth = self.base_depth

    def next_depth(self, proactive: bool = False, reused: int = 0) -> CAACDecision:
        esr, _ = self._gate()
        return self._decision(self.depth, esr, 1.0, float(self.depth), False)
