"""The ``rapid`` command line: one meaning per option, defaults in help, bad input refused in one
line before any model loads, --version, every subcommand listed, log lines with date and level."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest

from rapid.core.procs import free_port


def rapid(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rapid.cli", *args], capture_output=True, text=True, timeout=timeout)


def test_version_and_every_subcommand_in_help():
    assert rapid("--version").stdout.startswith("rapid ")
    out = rapid("--help").stdout
    for name in ("models", "serve", "generate", "demo", "export", "edge", "bench", "sim", "doctor"):
        assert name in out, name


@pytest.mark.parametrize("cmd, flag", [("generate", "--max-context"), ("serve", "--max-context"),
                                       ("demo", "--num-prompts"), ("edge", "--max-context")])
def test_help_shows_defaults_and_one_name_per_meaning(cmd, flag):
    args = (cmd, "x", "--help") if cmd == "generate" else (cmd, "--help")
    out = rapid(*args).stdout
    assert flag in out and "(default:" in out
    if cmd in ("generate", "edge"):
        assert "--children" in out and "--engine" in out  # tree children, and the backend


@pytest.mark.parametrize("cmd", ["generate", "edge", "demo"])
def test_edge_commands_share_the_int4_draft_and_honest_flag_help(cmd):
    wide = dict(os.environ, COLUMNS="400")  # one line per option
    out = subprocess.run([sys.executable, "-m", "rapid.cli", cmd, "--help"], capture_output=True, text=True,
                         timeout=60, env=wide).stdout
    out = " ".join(out.split())
    assert "(default: default-draft-int4)" in out
    assert "--max-tokens MAX_TOKENS new tokens to generate at most (default:" in out
    assert "without the flag they are coupled" in out and "coupled (default: True)" not in out
    assert "--lookup LOOKUP" in out


@pytest.mark.parametrize("args, says", [
    (("generate", "x", "--cloud", "http//x"), "expected ws://HOST:PORT"),
    (("generate", "x", "--policy", "rapd"), "invalid choice: 'rapd'"),
    (("generate", "x", "--engine", "tensorflow"), "invalid choice: 'tensorflow'"),
    (("edge", "--cloud", "ws://nohost"), "expected ws://HOST:PORT"),
    (("edge", "--engine", "bogus"), "choose from auto, torch, onnx, trt"),
    (("serve", "--device", "gpu", "--target", "/nonexistent"), "expected auto, cpu, cuda"),
    (("serve", "--threads", "0"), "--threads must be >= 1, got 0"),
    (("serve", "--port", "70000"), "--port must be in [0, 65535]"),
    (("serve", "--grace", "-1"), "--grace must be >= 0, got -1.0"),  # a session limit, named by its flag
    (("serve", "--batch-window-ms", "nan"), "--batch-window-ms must be >= 0"),
    (("serve", "--replicas", "2", "--max-batch", "0"), "--max-batch must be >= 1"),  # the Ray path, before Ray
    (("edge", "--port", "70000"), "--port must name a port in [1, 65535]"),
    (("edge", "--parallel", "0"), "--parallel must be >= 1, got 0"),
    (("edge", "--max-tokens", "0"), "--max-tokens must be >= 1, got 0"),  # was checked after the engines loaded
    (("edge", "--verdict-timeout", "0"), "--verdict-timeout must be a finite number > 0"),  # was a traceback
    # at the first request
    (("generate", "x", "--seed", "-1", "--temperature", "1"), "--seed must be in [0, 2**63), got -1"),
    (("demo", "--num-prompts", "0"), "--num-prompts must be in [1, "),  # none run is no "identical on every prompt"
    (("bench", "--repeats", "0"), "--repeats must be >= 1, got 0"),
    (("bench", "--max-tokens", "0"), "--max-tokens must be >= 1, got 0"),
    (("bench", "--contention", "sustained,weird"), "bad contention schedule 'weird'"),
    (("bench", "--profiles", "moon"), "unknown network profile 'moon'"),
    (("sim", "--traces", "/nonexistent", "--edges", "1,0"), "--edges wants counts >= 1"),
    (("sim", "--traces", "/nonexistent", "--policies", "rapd"), "unknown policy 'rapd'"),
    (("generate", "x", "--depth", "9"), "--depth must be in [1, 8], got 9"),  # was CAAC's ValueError, loaded
    (("edge", "--depth", "9"), "--depth must be in [1, 8], got 9"),
    (("edge", "--port", "0"), "--port must name a port in [1, 65535], got 0"),  # was: listened on 8000
    (("edge", "--listen", "999.9.9.9:8123"), "cannot listen on 999.9.9.9:8123"),  # was uvicorn's, after loading
    (("generate", "x", "--trace", "/nonexistent/dir/t.jsonl"), "--trace: cannot write /nonexistent/dir/t.jsonl"),
    (("serve", "--replicas", "0"), "--replicas must be >= 1, got 0"),  # was taken as 1
    (("bench", "--out", "/etc/passwd", "--sets", "c4"), "cannot create the output folder /etc/passwd"),
    (("serve", "--replicas", "1", "--target", "/nonexistent/model"), "no such folder or file: /nonexistent/model"),
])
def test_bad_input_is_one_line_before_any_model_loads(args, says):
    t0 = time.time()
    r = rapid(*args)
    assert r.returncode == 2 and says in r.stderr and "Traceback" not in r.stderr, r.stderr[-800:]
    assert "engine: " not in r.stderr and "loading target" not in r.stderr, r.stderr[-800:]  # nothing loaded
    assert time.time() - t0 < 30


def test_serve_on_a_busy_port_says_so_before_loading():
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        r = rapid("serve", "--target", "default-target", "--port", str(port))
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr
    assert "loading target" not in r.stderr and "Traceback" not in r.stderr


def test_edge_on_a_busy_port_says_so_before_loading():
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        r = rapid("edge", "--port", str(port))
    assert r.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in r.stderr and "another server" in r.stderr
    assert "engine: " not in r.stderr and "Traceback" not in r.stderr


def test_serve_with_a_missing_target_says_so_before_loading():
    r = rapid("serve", "--target", "/nonexistent/model", "--port", str(free_port()))
    assert r.returncode == 2 and "no such folder or file: /nonexistent/model" in r.stderr
    assert "loading target" not in r.stderr and "dtype" not in r.stderr and "Traceback" not in r.stderr


def test_log_lines_have_date_level_logger_or_are_json(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # resolves, so the server logs, then refused in one line
    r = rapid("serve", "--target", str(tmp_path), "--port", str(free_port()))
    assert r.returncode == 2 and "cannot load a causal LM" in r.stderr and "Traceback" not in r.stderr
    line = next(x for x in r.stderr.splitlines() if "rapid.server" in x)
    date, clock, level, logger = line.split()[:4]
    assert len(date) == 10 and date[4] == "-" and len(clock) == 8 and level in ("INFO", "WARNING")
    assert logger == "rapid.server:"
    r = rapid("--log-format", "json", "serve", "--target", str(tmp_path), "--port", str(free_port()))
    records = [json.loads(x) for x in r.stderr.splitlines() if x.startswith("{")]
    assert records and {"ts", "level", "logger", "message"} <= set(records[0])


def test_a_hub_id_without_a_hub_is_one_line():
    r = subprocess.run([sys.executable, "-m", "rapid.cli", "generate", "x", "--draft", "nobody/not-a-model",
                        "--engine", "torch"], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 2 and "not in the local cache" in r.stderr and "local model folder" in r.stderr
    assert "Traceback" not in r.stderr
