"""Background processes on loopback: pick a port, start a server, wait until it listens, stop it.

Used by ``rapid demo``, ``rapid bench``, the scripts and the tests. Standard library only (no
torch): the edge side can start and stop a cloud process too.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from rapid.core.errors import RapidError


class PortInUseError(RapidError):
    """The address a server (``rapid serve``, ``rapid edge``) should listen on cannot be bound."""


def check_port_free(host: str, port: int) -> None:
    """Bind and release ``host:port`` now, so a busy port (or a host this machine does not have)
    is one line before minutes of loading."""
    try:
        with socket.create_server((host, port)):
            pass
    except OSError as e:
        busy = "; is another server running?" if e.errno == errno.EADDRINUSE else ""
        raise PortInUseError(f"cannot listen on {host}:{port} ({e.strerror or e}){busy}") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def split_cores() -> tuple[set[int], set[int]] | None:
    """(edge cores, cloud cores): the first allowed core for the edge, the next for the cloud,
    so the proactive branch really drafts while the cloud verifies; None on a single core."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    return ({cpus[0]}, {cpus[1]}) if len(cpus) >= 2 else None


def start_listening(cmd: Sequence[str], host: str, port: int, timeout: float = 600.0,
                    log_path: Path | None = None, env: Mapping[str, str] | None = None,
                    cpus: set[int] | None = None) -> subprocess.Popen:
    """Start ``cmd`` (its output to ``log_path``, pinned to ``cpus`` when given) and wait until it
    accepts connections on ``host:port``."""
    log = open(log_path or os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=None if env is None else dict(env),
                            preexec_fn=pin)
    return wait_listening(proc, host, port, timeout, log_path)


def start_server(target: str, port: int, extra: list[str] | None = None, timeout: float = 600.0,
                 log_path: Path | None = None, cpus: set[int] | None = None) -> subprocess.Popen:
    """Start ``rapid serve`` on loopback (pinned to ``cpus``) and wait until its port accepts connections."""
    cmd = [sys.executable, "-m", "rapid.cli", "serve", "--target", target, "--port", str(port), *(extra or [])]
    return start_listening(cmd, "127.0.0.1", port, timeout, log_path, cpus=cpus)


def wait_listening(proc: subprocess.Popen, host: str, port: int, timeout: float,
                   log_path: Path | None = None) -> subprocess.Popen:
    """Wait until ``proc`` accepts connections on ``host:port``; a clear error if it dies or stalls."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            msg = Path(log_path).read_text()[-2000:] if log_path else ""
            raise RapidError(f"the verifier exited with code {proc.returncode} before listening\n{msg}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return proc
        except OSError:
            time.sleep(0.3)
    proc.kill()
    raise RapidError(f"the verifier did not listen on {host}:{port} within {timeout:.0f}s")


def stop_server(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
