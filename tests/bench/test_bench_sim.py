import pytest

from rapid.bench import sim
from rapid.bench.contention import parse_schedule
from rapid.bench.netem import get_profile
from rapid.runtime import caac, policies


@pytest.fixture
def cal(canned):
    rounds, runs, meta = sim.load_traces([canned])
    return sim.calibrate(rounds, runs, meta)


def test_calibration_reads_the_traces(cal):
    assert cal.slowdown == pytest.approx(2.0, rel=0.15)
    assert cal.verify_b == pytest.approx(0.01, rel=1e-6) and cal.verify_a == pytest.approx(0.05, rel=1e-6)
    assert cal.overhead_s == pytest.approx(0.002, abs=1e-6)
    assert len(cal.match_bits) > 100 and 0 < cal.p_accept < 1


def test_simulator_is_deterministic_with_a_seed(cal):
    args = (cal, parse_schedule("burst:1:1"), get_profile("wan"))
    a = sim.simulate(policies.POLICIES["rapid"], *args, tokens=96, seed=3)
    b = sim.simulate(policies.POLICIES["rapid"], *args, tokens=96, seed=3)
    c = sim.simulate(policies.POLICIES["rapid"], *args, tokens=96, seed=4)
    assert a["edges"][0] == b["edges"][0] and a["horizon_s"] == b["horizon_s"]
    assert a["edges"][0].tokens == 96
    assert c["horizon_s"] != a["horizon_s"]


@pytest.mark.parametrize("sched", ["none", "sustained", "burst:1:1"])
def test_oracle_bounds_every_policy(cal, sched):
    s, p = parse_schedule(sched), get_profile("wan")
    for seed in range(3):
        orc = sim.simulate(sim.ORACLE, cal, s, p, tokens=128, seed=seed)["edges"][0].tok_s
        for name, pol in policies.POLICIES.items():
            got = sim.simulate(pol, cal, s, p, tokens=128, seed=seed)["edges"][0].tok_s
            assert orc >= got, (sched, seed, name, got, orc)


def test_simulator_uses_the_runtime_objects(cal):
    assert sim.POLICIES is policies.POLICIES
    for name, pol in policies.POLICIES.items():
        e = sim._Edge(0, pol, cal, parse_schedule("none"), get_profile("lan"), 16, 0, 0.0, False,
                      sim.CoordinatorConfig(depth=4))
        assert e.policy is policies.POLICIES[name]
        assert type(e.ctrl) is (caac.CAAC if pol.adaptive_depth else caac.FixedDepth)
    assert sim.Coordinator.__module__ == "rapid.runtime.coordinator"


def test_many_edges_share_a_batched_cloud(cal):
    one = sim.simulate(policies.POLICIES["fixed"], cal, parse_schedule("none"), get_profile("lan"), 48, 0, edges=1)
    many = sim.simulate(policies.POLICIES["fixed"], cal, parse_schedule("none"), get_profile("lan"), 48, 0,
                        edges=32, max_batch=8)
    assert len(many["edges"]) == 32 and all(e.tokens == 48 for e in many["edges"])
    assert many["mean_batch"] > 1 and 0 < many["cloud_util"] <= 1.0 + 1e-9
    assert many["cloud_util"] > one["cloud_util"]


def test_sim_cli_writes_its_report(canned, tmp_path):
    from rapid.bench.cli import main_sim

    out = tmp_path / "sim"
    assert main_sim(["--traces", str(canned), "--out", str(out), "--seeds", "2", "--tokens", "48",
                     "--edges", "1,8"]) == 0
    for f in ("sim.json", "sim.md", "scale.png"):
        assert (out / f).exists()
    md = (out / "sim.md").read_text()
    assert "Validation" in md and "fraction of oracle" in md
