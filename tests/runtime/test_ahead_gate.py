"""AheadGate: round 0's free levels, pure."""

from __future__ import annotations

import pytest

from rapid.runtime.ahead_gate import AheadGate


def test_nothing_past_the_plan_until_a_ready_time_is_known():
    gate = AheadGate()
    assert gate.expected(64) == 0.0
    assert not gate.start(0.0, 0.01, 64)
    gate.observe(0.0, 64)  # no time, no prompt: nothing learnt
    gate.observe(1.0, 0)
    assert gate.per_token_s == 0.0


def test_a_step_starts_while_it_ends_by_ready_plus_its_late_share():
    gate = AheadGate(late=0.5)
    gate.observe(2.0, 64)  # 2 s for 64 tokens: T(64) = 2 s, T(32) = 1 s
    assert gate.expected(64) == pytest.approx(2.0) and gate.expected(32) == pytest.approx(1.0)
    assert gate.start(1.7, 0.3, 64)  # ends at Ready
    assert gate.start(1.85, 0.3, 64)  # ends 0.15 s late: half its price
    assert not gate.start(1.86, 0.3, 64)
    assert not gate.start(0.9, 0.3, 32)
    assert not gate.start(0.0, 0.0, 64)  # a step of unknown cost


def test_the_ready_time_is_an_ema_per_prompt_token():
    gate = AheadGate(alpha=0.5)
    gate.observe(1.0, 10)
    gate.observe(3.0, 10)
    assert gate.per_token_s == pytest.approx(0.2)


@pytest.mark.parametrize("alpha, late", [(0.0, 0.5), (1.5, 0.5), (0.3, -0.1), (0.3, 1.1)])
def test_bad_constants_are_refused(alpha, late):
    with pytest.raises(ValueError, match="need alpha"):
        AheadGate(alpha=alpha, late=late)
