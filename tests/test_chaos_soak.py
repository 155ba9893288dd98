"""The chaos soak (scripts/chaos_soak.py) in CI: ~30 s of faults against real processes.

The long run is ``python scripts/chaos_soak.py --minutes 5 --edges 3 --seed 0 --secure --out DIR``
(docs/reliability.md). Here, in the production shape (``--secure``: wss:// with a certificate, the
token on every hop): two edge slots, every fault kind at least once (a SIGTERM drain too), a
rogue connection without the token refused with 401, and the same checks:
no hang, no leaked session, every finished run identical to target-only decoding, every failed run
a clean one-line error. The classifier the checks rest on is tested on its own below, so a
broken run really fails them.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
    spec.loader.exec_module(module)
    return module


edges = _load("chaos_edges")
report = _load("chaos_report")


@pytest.mark.slow
def test_short_soak_has_no_hang_leak_mismatch_or_unclean_error(tmp_path):
    cmd = [sys.executable, str(SCRIPTS / "chaos_soak.py"), "--minutes", "0.5", "--edges", "2", "--seed", "3",
           "--out", str(tmp_path), "--run-timeout", "60", "--grace", "2", "--cloud-kill-every", "30",
           "--freeze-every", "30", "--edge-kill-every", "15", "--cut-all-every", "10", "--rogue-every", "3",
           "--cut", "0.01", "--blackhole-every", "0",  # a half-open connection costs a 30 s deadline
           "--min-identical", "2", "--secure", "--drain-every", "30",
           "--min-uptime", "6"]  # two restarts (a kill, a drain) within the 30 s
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    result = json.loads((tmp_path / "report.json").read_text())
    s, outcomes = result["summary"], result["summary"]["outcomes"]
    why = f"{result['failures']}\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
    assert r.returncode == 0 and result["passed"], why
    assert outcomes["hang"] == 0, why
    assert s["leak"]["sessions_active"] == 0 and s["leak"]["sessions_before_grace"] >= 1, why
    assert outcomes["mismatch"] == 0 and outcomes["identical"] >= 2, why
    assert outcomes["unclean_error"] == 0, why
    assert s["runs"] == outcomes["identical"] + outcomes["clean_error"] + outcomes["killed"], why
    for kind in ("cloud_kill", "cloud_drain", "cloud_freeze", "edge_kill", "proxy_cut_all"):
        assert s["faults"].get(kind, 0) >= 1, (kind, why)
    assert sum(v for k, v in s["faults"].items() if k.startswith("rogue_")) >= 5, why
    assert s["faults"].get("rogue_no_token", 0) >= 1, why  # refused with HTTP 401 (else an anomaly below)
    assert not s["rogue"]["anomalies"] and s["rogue"]["outcomes"].get("ok", 0) >= 3, why
    assert len(s["cloud"]) >= 2 and s["rss_mb"]["max"] > 0, why  # restarted on the same port
    assert "| finished, identical to target-only |" in r.stdout


@pytest.mark.slow
def test_short_soak_on_two_ray_replicas_with_replica_kills(tmp_path):
    """`rapid serve --replicas 2` (a real local Ray cluster) over wss with the token: replicas
    SIGKILLed while edges run; every finished run identical, no hang, no leaked session."""
    pytest.importorskip("ray")
    cmd = [sys.executable, str(SCRIPTS / "chaos_soak.py"), "--minutes", "0.5", "--edges", "2", "--seed", "5",
           "--out", str(tmp_path), "--run-timeout", "90", "--grace", "2", "--replicas", "2", "--secure",
           "--replica-kill-every", "12", "--edge-kill-every", "20", "--cut-all-every", "15", "--rogue-every", "5",
           "--blackhole-every", "0", "--min-identical", "2"]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=420)
    result = json.loads((tmp_path / "report.json").read_text())
    s, outcomes = result["summary"], result["summary"]["outcomes"]
    why = f"{result['failures']}\n{r.stdout[-3000:]}\n{r.stderr[-2000:]}"
    assert r.returncode == 0 and result["passed"], why
    assert outcomes["hang"] == outcomes["mismatch"] == outcomes["unclean_error"] == 0, why
    assert outcomes["identical"] >= 2 and s["faults"].get("replica_kill", 0) >= 1, why
    assert s["leak"]["sessions_active"] == 0, why
    assert "cloud_kill" not in s["faults"] and not s["rogue"]["anomalies"], why


def _job(expected):
    return edges.Job("abc", 8, edges.SAMPLINGS[0], 0, expected)


def _render(ids):
    return "".join(edges.ALPHABET[i] for i in ids if i != edges.EOS) + "\n"


def test_classify_finished_runs_token_for_token():
    ids = [5, 120, 33, 200, 258]
    ok_err = "12:00:00 rapid.edge: draft engine: torch on cpu\n[rapid] 5 tokens in 3 rounds, 0.1s\n"
    assert edges.classify(0, _render(ids), ok_err, _job(ids), "rapid") == ("identical", "")
    stopped = [*ids, edges.EOS]  # the stop token is counted, not rendered
    assert edges.classify(0, _render(stopped), ok_err.replace("5 tokens", "6 tokens"), _job(stopped), "rapid")[0] \
        == "identical"
    assert edges.classify(0, _render([5, 121, 33, 200, 258]), ok_err, _job(ids), "rapid")[0] == "mismatch"
    assert edges.classify(0, _render(ids[:-1]), ok_err, _job(ids), "rapid")[0] == "mismatch"
    assert edges.classify(0, _render(ids), ok_err.replace("5 tokens", "4 tokens"), _job(ids), "rapid")[0] == "mismatch"
    assert edges.classify(0, _render(ids), ok_err, _job(ids), "npdg")[0] == "mismatch"  # another policy's line


def test_classify_failures_clean_only_when_typed_and_one_line():
    job = _job([1])
    line = "rapid generate: error: cloud error [deadline]: no verdict for round 3 within 30.0s"
    assert edges.classify(2, "", f"log line\n{line}\n", job, "rapid") == ("clean_error", "cloud_deadline")
    assert edges.classify(2, "", "rapid generate: error: model folder not found\n", job, "rapid") \
        == ("clean_error", "rapid_model_folder_not_found")
    assert edges.classify(1, "", "Traceback (most recent call last):\n  ...\nKeyError: 3\n", job, "rapid")[0] \
        == "unclean_error"
    assert edges.classify(2, "", f"Traceback (most recent call last):\n{line}\n", job, "rapid")[0] == "unclean_error"
    assert edges.classify(2, "", f"{line}\nmore text\n", job, "rapid")[0] == "unclean_error"
    assert edges.classify(2, "", f"{line}\n{line}\n", job, "rapid")[0] == "unclean_error"
    assert edges.classify(-9, "", "", job, "rapid")[0] == "unclean_error"
    assert edges.classify(-9, "", "", job, "rapid", killed=True)[0] == "killed"
    assert edges.classify(None, "", "", job, "rapid", hung=True)[0] == "hang"


def test_report_fails_on_a_leak_a_hang_or_an_unreadable_gauge():
    def summary(leak, **outcomes):
        runs = [{"outcome": k, "policy": "rapid", "detail": "", "reconnects": 0, "index": 0, "draft": "same",
                 "route": "direct", "job": 0, "wall_s": 1.0} for k, n in outcomes.items() for _ in range(n)]
        return report.summarize(runs, {}, {}, [], [], [], leak)

    assert report.failures(summary({"sessions_active": 0}, identical=3, killed=1)) == []
    assert report.failures(summary({"sessions_active": 1}, identical=3))
    assert report.failures(summary({"sessions_active": None}, identical=3))
    assert report.failures(summary({"sessions_active": 0}, identical=3, hang=1))
    assert report.failures(summary({"sessions_active": 0}, identical=3, mismatch=1))
    assert report.failures(summary({"sessions_active": 0}, identical=3, unclean_error=1))
    assert report.failures(summary({"sessions_active": 0}, killed=2))  # nothing finished: nothing checked
