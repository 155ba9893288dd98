"""CAAC's slowdown gate on device-like step-cost curves (issue 15, item 1).

A step's cost depends on how many tokens it feeds, and how depends on the machine: constant on a
GPU / Jetson, linear on a float32 CPU, flat then rising on a bf16 CPU. Tokens per step vary
inside every round, so the gate must not read a change of step size as a slowdown. Each round
drafts ``depth`` steps of random sizes with 10 % Gaussian jitter; every 60 rounds a new request
starts with a prefill step of a new prompt length (a class never seen before).
"""

from __future__ import annotations

import random

import pytest

from rapid.runtime.caac import CAAC, CAACConfig
from rapid.runtime.step_cost import StepBaseline

CURVES = {  # seconds of one step feeding T tokens, and the step sizes a round draws from
    "gpu": (lambda t: 0.020, (1, 2, 2, 4)),
    "cpu": (lambda t: 0.002 + 0.004 * t, (1, 2, 2, 4)),
    "bf16": (lambda t: 0.010 * max(1.0, t / 8), (1, 2, 4, 8, 12, 16)),
}
JITTER = 0.10


class Device:
    """A simulated edge: ``slowdown`` multiplies every step's cost while it is set."""

    def __init__(self, curve: str, seed: int) -> None:
        self.cost, self.sizes = CURVES[curve]
        self.rng = random.Random(seed)
        self.slowdown = 1.0

    def seconds(self, tokens: int) -> float:
        return self.cost(tokens) * self.slowdown * max(0.5, 1 + JITTER * self.rng.gauss(0, 1))


def run_rounds(ctl: CAAC, dev: Device, n: int) -> list[float]:
    """n rounds; returns the eta of each round's decision (taken before its steps)."""
    etas = []
    for _ in range(n):
        if ctl.snapshot()["rounds"] % 60 == 0:  # a new request: a prefill of a new length
            ctl.new_request()
            t = dev.rng.randint(20, 400)
            ctl.observe_step(dev.seconds(t), t)
        dec = ctl.next_depth()
        etas.append(dec.eta)
        for _ in range(dec.depth):
            t = dev.rng.choice(dev.sizes)
            ctl.observe_step(dev.seconds(t), t)
        ctl.observe_round(round(0.65 * dec.depth), dec.depth, 0.1)  # keeps B_hat at its base
    return etas


@pytest.mark.parametrize("curve", list(CURVES))
@pytest.mark.parametrize("seed", range(4))
def test_no_load_keeps_the_gate_open(curve, seed):
    etas = run_rounds(CAAC(), Device(curve, seed), 400)
    open_share = sum(e == 1.0 for e in etas) / len(etas)
    assert open_share >= 0.98, open_share


@pytest.mark.parametrize("curve", list(CURVES))
@pytest.mark.parametrize("initial_depth", [4, 2])  # 2: eta * B_hat = 1.2, one step per round
def test_a_2x_slowdown_closes_the_gate_within_3_rounds_and_it_reopens_within_3(curve, initial_depth):
    for seed in range(3):
        ctl, dev = CAAC(initial_depth=initial_depth), Device(curve, seed)
        run_rounds(ctl, dev, 50)
        dev.slowdown = 2.0
        loaded = run_rounds(ctl, dev, 40)
        closed_at = next(i for i, e in enumerate(loaded) if e < 1.0)
        assert closed_at <= 3, (seed, loaded[:6])
        assert all(e < 1.0 for e in loaded[closed_at:]), (seed, loaded)  # held while it lasts
        dev.slowdown = 1.0
        after = run_rounds(ctl, dev, 60)
        reopened_at = next(i for i, e in enumerate(after) if e == 1.0)
        assert reopened_at <= 3, (seed, after[:6])
        assert sum(e == 1.0 for e in after[reopened_at:]) >= 0.98 * len(after[reopened_at:])


def test_a_change_of_step_size_alone_is_not_a_slowdown():
    """GPU-like: the same cost whatever T. 1-token steps, then 8-token steps at the same cost
    (per-token time 8x lower), then back: the slowdown ratio stays 1."""
    ctl = CAAC(CAACConfig(n_warmup=2))
    for t in [1] * 30 + [8] * 30 + [1] * 30 + [2, 8, 1, 4] * 10:
        ctl.observe_step(0.02, t)
        d = ctl.next_depth()
        assert d.esr == pytest.approx(1.0) and d.eta == 1.0, t


def test_a_new_step_size_under_load_is_neutral_and_does_not_learn_the_load():
    """A class first seen during a slowdown opens at seconds / ESR: it reads the current ESR,
    and once the load ends it reads ~1 rather than 0.5."""
    ctl = CAAC()
    for _ in range(40):
        ctl.observe_step(0.02, 2)
    for _ in range(8):
        ctl.observe_step(0.04, 2)
    esr = ctl.next_depth().esr
    ctl.observe_step(0.04, 5)  # size 5 never seen: its first step is taken at the current ESR
    assert ctl.next_depth().esr == pytest.approx(esr)
    for _ in range(12):
        ctl.observe_step(0.02, 2)
        ctl.observe_step(0.02, 5)  # size 5 at its uncontended cost: reads ~1, not 0.5
    assert ctl.next_depth().esr == pytest.approx(1.0, abs=0.05)


def test_step_baseline_averages_each_class_then_follows_at_the_rate():
    b = StepBaseline(max_classes=3)
    assert b.predict(4) is None
    assert b.start(4, 0.30, esr=1.5) == pytest.approx(0.20)  # de-rated by the current ESR
    b.update(4, 0.10, rate=0.01, average=True)  # running mean of 0.20 and 0.10
    assert b.predict(4) == pytest.approx(0.15) and b.count(4) == 2
    b.update(4, 1.15, rate=0.001, average=False)  # above the band: the hold rate only
    assert b.predict(4) == pytest.approx(0.15 + 0.001 * 1.0)
    for t in (1, 2, 3):  # a fourth class drops the least recently seen one (4)
        b.start(t, 0.1, esr=1.0)
    assert len(b) == 3 and b.predict(4) is None and b.classes() == {1: 0.1, 2: 0.1, 3: 0.1}
    b.update(1, 0.1, 0.01, True)  # 1 is now the most recently seen; 2 goes next
    b.start(9, 0.1, 1.0)
    assert set(b.classes()) == {1, 3, 9}
    with pytest.raises(ValueError, match="max_classes"):
        StepBaseline(0)


def test_a_step_beside_the_verify_is_compared_with_its_own_kind():
    """On one host a step that runs while the cloud verifies (a branch or catch-up step) costs
    ~1.3x a drafting step of its size, load or not (Zen 3: 0.156 / 0.123 s idle, 0.333 / 0.247 s
    under a sustained load). Learnt from a mix of mostly drafting steps, one baseline per size
    blended both kinds; when the mix moved to beside-steps alone (rapid-cost drafting nothing
    under load: only catch-up steps) the ESR read load x co-location, 2.6 for a 2.2x load, and
    priced every drafting step that much too high. Each kind against its own reads the load; the
    critical path's prices come from the drafting steps alone."""
    ctl = CAAC(CAACConfig(n_warmup=4))
    for _ in range(30):  # no load: four drafting steps to one beside the verify
        for tokens in (1, 2, 1, 2):
            ctl.observe_step(0.10, tokens)
        ctl.observe_step(0.135, 1, beside=True)
    idle = ctl.next_depth()
    assert idle.esr == pytest.approx(1.0, abs=0.02) and idle.eta == 1.0
    for _ in range(40):  # a 2.2x load, and only catch-up steps beside the verify
        ctl.observe_step(0.135 * 2.2, 1, beside=True)
    assert 2.0 < ctl.next_depth().esr < 2.35
    assert ctl._phys.baseline.classes() == pytest.approx({1: 0.10, 2: 0.10})
