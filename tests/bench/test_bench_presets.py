import statistics

import pytest

from rapid.bench import calibration, presets, sim
from rapid.bench.contention import parse_schedule
from rapid.bench.traces import load_traces
from rapid.runtime import policies


@pytest.fixture
def cal(canned):
    rounds, runs, meta = load_traces([canned])
    return calibration.calibrate(rounds, runs, meta)


def test_presets_carry_the_published_numbers(cal):
    agx = presets.apply_preset(cal, presets.get_preset("orin-agx-a100"))
    nano = presets.apply_preset(cal, presets.get_preset("orin-nano-h100"))
    one = [s * agx.step_scale(1) for s in agx.step_s]  # one-token steps
    assert min(one) == pytest.approx(0.008) and max(one) == pytest.approx(0.010)
    assert agx.step_curve_at(8) / agx.step_curve_at(1) == pytest.approx(1.10)
    assert agx.step_curve_at(16) / agx.step_curve_at(1) == pytest.approx(1.25)
    assert statistics.median(nano.step_s) == pytest.approx(2 * statistics.median(agx.step_s))
    assert agx.verify(1) == agx.verify(64) == pytest.approx(0.023) and agx.verify(256) > agx.verify(64)
    assert nano.verify(1) == nano.verify(64) == pytest.approx(0.014)
    # the acceptance half stays the traced one; start-up is out of the comparison
    assert agx.match_bits == cal.match_bits and agx.p_accept == cal.p_accept
    assert agx.startup_s == agx.prefill_s == 0.0
    assert presets.net_profile("rtt14").rtt_ms == 14.0 and presets.net_profile("wan").rtt_ms == 30.0
    with pytest.raises(ValueError):
        presets.get_preset("orin-tx2")


@pytest.mark.parametrize("spec,factor", [("burst:1:1:0.2", 1.1), ("burst:1:1:0.6", 1.3), ("burst:1:1", 1.5)])
def test_contention_episodes_slow_a_step_as_stated(cal, spec, factor):
    c = presets.apply_preset(cal, presets.get_preset("orin-agx-h100"))
    e = sim._Edge(0, policies.POLICIES["rapid"], c, parse_schedule(spec), presets.net_profile("rtt5"), 16, 0, 0.0,
                  False, sim.CoordinatorConfig(depth=4))
    assert e.factor(0.5) == pytest.approx(factor) and e.factor(1.5) == 1.0  # 1 s on, 1 s off


def test_without_a_curve_a_step_costs_its_tokens(cal):
    assert cal.step_curve is None and cal.step_scale(1) == 1 / cal.step_tokens and cal.step_scale(cal.step_tokens) == 1


@pytest.mark.parametrize("preset", list(presets.PRESETS))
def test_the_oracle_bounds_every_policy_in_the_deployment_regime(cal, preset):
    """The myopic oracle (best rate for one round) failed this on the bench traces where a step costs about
    verify + RTT (orin-nano-h100 at 5 ms); the planned one holds in every preset and RTT."""
    c = presets.apply_preset(cal, presets.get_preset(preset))
    for prof in ("rtt5", "rtt150"):
        for spec in ("none", "burst:1:1"):
            p, s = presets.net_profile(prof), parse_schedule(spec)
            for seed in range(2):
                orc = sim.simulate(sim.ORACLE, c, s, p, tokens=96, seed=seed, startup=False)["edges"][0].tok_s
                for name, pol in policies.POLICIES.items():
                    got = sim.simulate(pol, c, s, p, tokens=96, seed=seed, startup=False)["edges"][0].tok_s
                    assert orc >= got, (preset, prof, spec, seed, name, got, orc)


def test_sim_cli_preset_reports_every_drafting_policy(canned, tmp_path):
    from rapid.bench.cli import main_sim

    out = tmp_path / "sim"
    assert main_sim(["--traces", str(canned), "--out", str(out), "--preset", "orin-agx-a100,orin-nano-h100",
                     "--profiles", "rtt14", "--contention", "none,burst:1:1", "--seeds", "1", "--tokens", "48"]) == 0
    md = (out / "presets.md").read_text()
    for name in [n for n, p in policies.POLICIES.items() if p.drafting] + ["oracle", "oracle-load"]:
        assert f"| {name} " in md or f" {name} |" in md
    assert "| ar " not in md and "orin-nano-h100 | rtt14" in md
    assert (out / "presets.json").exists()
