"""rapid.bench.beside_fit: the steps beside the verify, against the drafting steps."""

from __future__ import annotations

import pytest

from rapid.bench.beside_fit import CATCH_UP, BesideFit, fit_beside
from rapid.bench.calibration import calibrate


def _branch(policy: str, steps: int, tokens: int, seconds: float, load: float = 0.0, rnd: int = 1) -> dict:
    return {"policy": policy, "round": rnd, "proactive_steps": steps, "catch_up_s": 0.0, "beside_s": seconds,
            "beside_tokens": tokens, "load": load}


def _catch_up(tokens: int, seconds: float) -> dict:
    return {"policy": "rapid-cost", "round": 3, "proactive_steps": 0, "catch_up_s": seconds, "beside_s": seconds,
            "beside_tokens": tokens, "load": 0.0}


def test_a_beside_step_costs_what_the_traces_say_at_their_size():
    """Drafting steps of 0.1 s; rapid's 2-step branches of 0.24 s feeding 3 tokens: a branch step is
    1.2 drafting steps, whatever a cost-by-tokens curve says of 1.5 tokens. Loaded rounds and round
    0 are no timing sample (their tokens count); a kind needs MIN_SAMPLES rounds for a ratio."""
    linear = lambda t: t / 2  # noqa: E731 — a linear cost-by-tokens curve at width 2
    rounds = [_branch("rapid", 2, 3, 0.24) for _ in range(10)] + [_catch_up(3, 0.13) for _ in range(10)]
    rounds += [_branch("rapid", 2, 3, 2.0, load=1.0), _branch("rapid", 2, 3, 2.0, rnd=0)]
    rounds += [_branch("ipdg", 1, 4, 0.5) for _ in range(3)]
    fit = fit_beside(rounds, [0.1, 0.1, 0.1])
    assert fit.ratio == pytest.approx({"rapid": 1.2, CATCH_UP: 1.3})
    assert fit.tokens == pytest.approx({"rapid": 1.5, CATCH_UP: 3.0, "ipdg": 4.0})
    assert fit.scale("rapid", linear, 2) == pytest.approx(1.2)  # not linear(1.5) = 0.75
    assert fit.scale("ipdg", linear, 2) == pytest.approx(2.0) and fit.step_tokens("ipdg", 2) == 4  # too few: its size
    assert fit.scale("fixed", linear, 2) == 1.0 and fit.step_tokens("fixed", 2) == 2  # untraced: a drafting step


def test_traces_without_the_fields_fit_nothing():
    old = [{"policy": "rapid", "round": 1, "proactive_steps": 2, "load": 0.0} for _ in range(20)]
    assert fit_beside(old, [0.1]) == BesideFit()


def test_a_cloud_elsewhere_drops_the_ratio_and_keeps_the_tokens():
    rounds = [dict(_branch("rapid", 1, 4, 0.26), set="c4", schedule="none", profile="wan", prompt_id="0",
                   repeat=0, depth=2, draft_steps=2, draft_s=0.2, tree_nodes=4, accepted=1, emitted=2)
              for _ in range(12)]
    cal = calibrate(rounds, [], {"config": {"width": 2}})
    assert cal.beside.scale("rapid", cal.step_scale, 2) == pytest.approx(2.6)
    cal.cloud_elsewhere()
    assert cal.beside.scale("rapid", cal.step_scale, 2) == pytest.approx(cal.step_scale(4))
    assert cal.to_json()["beside"]["colocated"] is False
