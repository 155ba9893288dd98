"""rapid.bench.beside_fit: the steps beside the verify, against drafting steps of as many tokens."""

from __future__ import annotations

import pytest

from rapid.bench.beside_fit import BesideFit, fit_beside
from rapid.bench.calibration import calibrate


def _branch(policy: str, steps: int, tokens: int, seconds: float, load: float = 0.0, rnd: int = 1) -> dict:
    return {"policy": policy, "round": rnd, "proactive_steps": steps, "catch_up_s": 0.0, "beside_s": seconds,
            "beside_tokens": tokens, "load": load}


def _catch_up(tokens: int, seconds: float) -> dict:
    return {"policy": "rapid-cost", "round": 3, "proactive_steps": 0, "catch_up_s": seconds, "beside_s": seconds,
            "beside_tokens": tokens, "load": 0.0}


def test_the_tax_divides_out_the_tokens_each_beside_step_fed():
    """Steps linear in tokens (0.1 s per 2 tokens): a 2-step branch feeding 8 tokens would take
    0.4 s alone; traced at 0.52 s it is a 1.3x tax. Loaded rounds and round 0 are no sample."""
    scale = lambda t: t / 2  # noqa: E731 — Calibration.step_scale of a linear CPU at width 2
    rounds = [_branch("rapid", 2, 8, 0.52) for _ in range(8)] + [_catch_up(3, 0.195) for _ in range(4)]
    rounds += [_branch("rapid", 2, 8, 2.0, load=1.0), _branch("rapid", 2, 8, 2.0, rnd=0)]
    fit = fit_beside(rounds, [0.1, 0.1, 0.1], scale)
    assert fit.tax == pytest.approx(1.3)
    assert fit.branch_tokens == {"rapid": 4.0} and fit.catch_up_tokens == 3.0


def test_traces_without_the_fields_or_too_few_samples_are_neutral():
    old = [{"policy": "rapid", "round": 1, "proactive_steps": 2, "load": 0.0} for _ in range(20)]
    assert fit_beside(old, [0.1], lambda t: t) == BesideFit()
    few = [_branch("ipdg", 1, 2, 0.3) for _ in range(3)]
    fit = fit_beside(few, [0.1], lambda t: t / 2)
    assert fit.tax == 1.0 and fit.branch_tokens == {"ipdg": 2.0}  # too few for a tax, the tokens are traced


def test_a_cloud_elsewhere_drops_the_tax_and_keeps_the_tokens():
    rounds = [dict(_branch("rapid", 1, 4, 0.26), set="c4", schedule="none", profile="wan", prompt_id="0",
                   repeat=0, depth=2, draft_steps=2, draft_s=0.2, tree_nodes=4, accepted=1, emitted=2)
              for _ in range(12)]
    cal = calibrate(rounds, [], {"config": {"width": 2}})
    assert cal.beside.tax == pytest.approx(1.3) and cal.beside.branch_tokens == {"rapid": 4.0}
    cal.cloud_elsewhere()
    assert cal.beside.tax == 1.0 and cal.beside.branch_tokens == {"rapid": 4.0}
    assert cal.to_json()["beside"]["tax"] == 1.0
