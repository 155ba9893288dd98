"""Background processes on loopback: pick a port, start a server, wait until it listens, stop it.

Used by ``rapid demo``, ``rapid bench``, the scripts and the tests. Standard library only (no
torch): the edge side can start and stop a cloud process too. On Linux a server started here
dies with the process that started it (even one killed by SIGKILL): no orphan keeps its model.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
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


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """libc's ``prctl``, resolved in the parent (no dlopen between fork and exec); None off Linux."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


def _preexec(cpus: set[int] | None, die_with_parent: bool) -> Callable[[], None] | None:
    """What the child runs between fork and exec: SIGTERM once the forking thread is gone (Linux's
    parent-death signal, kept across exec), then the pinning to ``cpus``; None when neither applies."""
    prctl = _prctl() if die_with_parent else None
    if prctl is None and not cpus:
        return None
    parent = os.getpid()

    def child() -> None:
        if prctl is not None and prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0 and os.getppid() != parent:
            os._exit(1)  # the parent died before prctl took effect: nobody would send the signal
        if cpus:
            os.sched_setaffinity(0, cpus)

    return child


def start_listening(cmd: Sequence[str], host: str, port: int, timeout: float = 600.0,
                    log_path: Path | None = None, env: Mapping[str, str] | None = None,
                    cpus: set[int] | None = None, die_with_parent: bool = True) -> subprocess.Popen:
    """Start ``cmd`` (its output to ``log_path``, pinned to ``cpus`` when given) and wait until it
    accepts connections on ``host:port``.

    On Linux, with ``die_with_parent``, the child gets SIGTERM when the *thread* calling this exits
    (its process killed included): call it from a long-lived thread, or pass False."""
    log = open(log_path or os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    proc = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=None if env is None else dict(env),
                            preexec_fn=_preexec(cpus, die_with_parent))
    return wait_listening(proc, host, port, timeout, log_path)


def start_server(target: str, port: int, extra: list[str] | None = None, timeout: float = 600.0,
                 log_path: Path | None = None, cpus: set[int] | None = None,
                 die_with_parent: bool = True) -> subprocess.Popen:
    """Start ``rapid serve`` on loopback (pinned to ``cpus``) and wait until its port accepts connections;
    it dies with the calling thread as in :func:`start_listening`."""
    cmd = [sys.executable, "-m", "rapid.cli", "serve", "--target", target, "--port", str(port), *(extra or [])]
    return start_listening(cmd, "127.0.0.1", port, timeout, log_path, cpus=cpus, die_with_parent=die_with_parent)


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
