"""Real processes: ``rapid serve`` and ``rapid generate`` as separate programs on loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from transformers import AutoTokenizer

from rapid.core.procs import free_port, start_server, stop_server
from rapid.core.sampling import SamplingParams
from rapid.server.target import reference_decode
from rapid.tiny import EOS_ID

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tiny_dir, tiny_pair, tmp_path_factory):
    port = free_port()
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    proc = start_server(tiny_dir("target", seed=0, dtype="float64"), port, ["--dtype", "float64"], timeout=120,
                        log_path=log)
    yield f"ws://127.0.0.1:{port}"
    stop_server(proc)


def rapid(*args, timeout=180):
    return subprocess.run([sys.executable, "-m", "rapid.cli", *args], capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize(("policy", "temperature"), [("rapid", 0.0), ("fixed", 0.0), ("ipdg", 0.9), ("ar", 0.9)])
def test_generate_process_matches_target_alone(served, tiny_dir, tiny_pair, tmp_path, policy, temperature):
    target, _ = tiny_pair
    draft = tiny_dir("partial", seed=1, base_seed=0, perturb=0.08, dtype="float64")
    tok = AutoTokenizer.from_pretrained(draft)
    prompt = "def add(a, b):"
    trace = tmp_path / "trace.jsonl"
    r = rapid("generate", prompt, "--draft", draft, "--engine", "torch", "--cloud", served, "--policy", policy,
              "--max-tokens", "24", "--temperature", str(temperature), "--seed", "5", "--trace", str(trace))
    assert r.returncode == 0, r.stderr
    ids = tok(prompt)["input_ids"]
    with torch.inference_mode():
        ref = reference_decode(target, ids, 24, SamplingParams(temperature, seed=5), (EOS_ID,))
    assert r.stdout == tok.decode(ref, skip_special_tokens=True) + "\n"
    assert f"[{policy}] {len(ref)} tokens" in r.stderr
    rows = [json.loads(line) for line in trace.read_text().splitlines()]
    assert rows and all(row["policy"] == policy for row in rows)
    assert sum(row["emitted"] for row in rows) == len(ref)


def test_unreachable_cloud_is_a_clear_error(tiny_dir):
    draft = tiny_dir("partial", seed=1, base_seed=0, perturb=0.08, dtype="float64")
    r = rapid("generate", "x", "--draft", draft, "--engine", "torch", "--cloud", f"ws://127.0.0.1:{free_port()}")
    assert r.returncode != 0
    assert "cannot connect" in r.stderr and "Traceback" not in r.stderr


def test_bad_model_path_is_a_clear_error(tmp_path):
    r = rapid("generate", "x", "--draft", str(tmp_path / "nope"), "--engine", "torch")
    assert r.returncode != 0 and "Traceback" not in r.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_server_whose_starter_is_killed_exits(proc_state, exited):
    """A real starter process (as ``rapid bench`` starts its cloud) starts a listening server with
    ``start_listening`` and is killed with SIGKILL (no cleanup runs): the server exits by itself
    instead of holding its port and memory as an orphan."""
    port = free_port()
    starter = subprocess.Popen(
        [sys.executable, "-c",
         "import os, sys, time\n"
         "from rapid.core.procs import start_listening\n"
         f"cmd = [sys.executable, '-m', 'http.server', '{port}', '--bind', '127.0.0.1']\n"
         f"proc = start_listening(cmd, '127.0.0.1', {port}, timeout=60, cpus={{min(os.sched_getaffinity(0))}})\n"
         "print(proc.pid, flush=True)\n"
         "time.sleep(600)\n"],
        stdout=subprocess.PIPE, text=True)
    server_pid = None
    try:
        server_pid = int(starter.stdout.readline())
        assert proc_state(server_pid) in ("R", "S")  # listening
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=10)
        # gone, or exited and not reaped by the init it went to
        assert exited(server_pid, within=10), "the server outlived its starter by 10 s"
    finally:
        if starter.poll() is None:
            starter.kill()
        if server_pid is not None and not exited(server_pid):
            os.kill(server_pid, signal.SIGKILL)
