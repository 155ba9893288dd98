import subprocess
import sys

import pytest

from rapid.bench.contention import Schedule, parse_schedule
from rapid.bench.prompts import PromptSetError, load_sets, pick, truncate_ids


def test_parse_and_names():
    assert parse_schedule("none") == Schedule()
    s = parse_schedule("sustained:0.5")
    assert (s.kind, s.intensity, s.name) == ("sustained", 0.5, "sustained:0.5")
    b = parse_schedule("burst:2:3")
    assert (b.on_s, b.off_s, b.intensity, b.name) == (2.0, 3.0, 1.0, "burst:2:3")
    assert parse_schedule(b.name) == b
    for bad in ("bogus", "burst:1", "sustained:2", "burst:0:1", "none:1"):
        with pytest.raises(ValueError):
            parse_schedule(bad)


def test_burst_periods_and_activity():
    b = parse_schedule("burst:2:3")
    assert b.active(0.0) and b.active(1.99) and not b.active(2.0) and not b.active(4.9) and b.active(5.0)
    assert b.periods(12) == [(0.0, 2.0), (5.0, 7.0), (10.0, 12)]
    assert b.load_fraction(0, 5, n=100) == pytest.approx(0.4)
    assert not Schedule().active(3) and Schedule().periods(10) == []
    s = parse_schedule("sustained")
    assert s.periods(10) == [(0.0, 10)] and s.load_fraction(1, 2) == 1.0


def test_intensity_is_a_duty_cycle():
    s = parse_schedule("sustained:0.25")
    ts = [k * 0.001 for k in range(10000)]
    frac = sum(s.busy(t) for t in ts) / len(ts)
    assert frac == pytest.approx(0.25, abs=0.02)
    assert not any(Schedule().busy(t) for t in ts)


def test_prompts_builtin_and_truncation(tmp_path):
    f = tmp_path / "x.json"
    f.write_text('[[1, "[INST] hello [/INST]"], [2, "b"], [3, "c"], [4, "d"]]')
    sets = load_sets(f)
    assert list(sets) == ["x"] and sets["x"][0].text == "hello"
    assert [p.id for p in pick(sets["x"], 2)] == ["1", "3"]
    assert truncate_ids(list(range(10)), 3) == [7, 8, 9] and truncate_ids([1, 2], 5) == [1, 2]
    with pytest.raises(PromptSetError, match="'nope'"):
        load_sets(f, ["nope"])


def test_bench_with_a_missing_prompt_set_says_so_in_one_line(tmp_path):
    f = tmp_path / "x.json"
    f.write_text('[[1, "a"]]')
    r = subprocess.run([sys.executable, "-m", "rapid.cli", "bench", "--sets", "oasst", "--prompts", str(f),
                        "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1].startswith("rapid bench: error: prompt sets ['oasst'] not found")
    assert "Traceback" not in r.stderr


def test_load_follows_the_edge_engine_device():
    from rapid.bench.contention import load_device_for

    assert load_device_for("cpu") == "cpu"
    assert load_device_for("CPUExecutionProvider") == "cpu"
    assert load_device_for("cuda:0") == "cuda"
    assert load_device_for("CUDAExecutionProvider") == "cuda"
    assert load_device_for("TensorrtExecutionProvider") == "cuda"
    assert load_device_for("cuda:0", "cpu") == "cpu"


def test_gpu_load_without_a_gpu_is_a_clear_error():
    from rapid.bench.contention import LoadProcess, gpu_load_available, parse_schedule
    from rapid.core.errors import RapidError

    ok, why = gpu_load_available()
    if ok:
        pytest.skip("a CUDA device is present: the GPU load runs (scripts/device_check.sh covers it)")
    with pytest.raises(RapidError, match="GPU contention load"):
        LoadProcess(parse_schedule("sustained"), None, "cuda")
    with pytest.raises(ValueError, match="load device"):
        LoadProcess(parse_schedule("sustained"), None, "tpu")
    LoadProcess(parse_schedule("none"), None, "cuda").close()  # no load, nothing to check


def test_a_load_whose_bench_is_killed_stops_spinning(tmp_path, proc_state, exited):
    """A real bench-like process starts a sustained load and is killed with SIGKILL (no close(),
    no atexit): its load process exits by itself instead of loading the machine for whatever runs
    next."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "bench_like.py"
    script.write_text(
        "import time\n"
        "from rapid.bench.contention import LoadProcess, parse_schedule\n"
        "if __name__ == '__main__':  # the load is spawned: it imports this file again\n"
        "    load = LoadProcess(parse_schedule('sustained'))\n"
        "    load.start_epoch()\n"
        "    print(load._proc.pid, flush=True)\n"
        "    time.sleep(600)\n")
    bench = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        load_pid = int(bench.stdout.readline())
        time.sleep(1.0)
        assert proc_state(load_pid) in ("R", "S")  # spinning (or between slots)
        bench.send_signal(signal.SIGKILL)
        bench.wait(timeout=10)
        if not exited(load_pid, within=10):  # gone, or exited and not yet reaped by the init it went to
            os.kill(load_pid, signal.SIGKILL)
            raise AssertionError("the load process outlived its bench by 10 s")
    finally:
        if bench.poll() is None:
            bench.kill()
