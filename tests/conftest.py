"""Shared fixtures: tiny random checkpoints built once per test session (no downloads).

float64 weights keep exactness tests about the algorithm, not about float rounding: a tree
forward and a one-token forward differ by ~1e-16 there, so a near-tie cannot flip an argmax.
"""

from __future__ import annotations

import logging
import os
import time

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(autouse=True)
def _root_logger_restored():
    """A CLI run in-process (``setup_logging``, ``basicConfig``) points the root logger at the
    test's captured stderr, which pytest closes after the test, and raises it to INFO: a thread
    the test left winding down (a server's websocket) then logs into a closed file ('--- Logging
    error ---' in the suite's output). Drop the handlers the test added (pytest's own excepted)
    and put the level back."""
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in before and not type(handler).__module__.startswith("_pytest"):
            root.removeHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """Folder factory: tiny_dir(name, **build_tiny kwargs) → built-once checkpoint folder."""
    from rapid.tiny import build_tiny

    root = tmp_path_factory.mktemp("tiny")
    cache: dict[str, str] = {}

    def make(name: str, **kw) -> str:
        if name not in cache:
            cache[name] = str(build_tiny(root / name, **kw))
        return cache[name]

    return make


@pytest.fixture(scope="session")
def tiny_pair(tiny_dir):
    """(target, drafts) as float64 Decoders: drafts = {same, partial, unrelated, llama}."""
    import torch
    from transformers import AutoModelForCausalLM

    from rapid.modeling import Decoder

    def load(path):
        return Decoder.from_hf(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64))

    target = load(tiny_dir("target", seed=0, dtype="float64"))
    drafts = {
        "same": target,
        "partial": load(tiny_dir("partial", seed=1, base_seed=0, perturb=0.08, dtype="float64")),
        "unrelated": load(tiny_dir("unrelated", seed=7, dtype="float64")),
    }
    return target, drafts


@pytest.fixture(scope="session")
def partial_onnx_export(tiny_dir, tmp_path_factory):
    """The float32 "partial" tiny draft exported to ONNX once (capacity 512, trees up to 64)."""
    from rapid.export.onnx_export import export_onnx

    out = tmp_path_factory.mktemp("onnx-draft")
    export_onnx(tiny_dir("partial32", seed=1, base_seed=0, perturb=0.08), out, max_context=512, max_tree=64,
                progress=False)
    return out


@pytest.fixture
def proc_state():
    """``proc_state(pid)``: the process's state letter from /proc (R running, S sleeping, Z exited,
    not reaped: this VM's init reaps no orphan), None once gone: for tests that kill a parent and
    check what it started goes with it."""

    def state(pid: int) -> str | None:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return None

    return state


@pytest.fixture
def exited(proc_state):
    """``exited(pid, within=0)``: whether the process is gone or has exited unreaped (state Z),
    polling up to ``within`` seconds."""

    def check(pid: int, within: float = 0.0) -> bool:
        deadline = time.monotonic() + within
        while proc_state(pid) not in (None, "Z"):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    return check
