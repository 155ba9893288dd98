"""Edge contention: schedules and a real co-running load process.

A schedule says, as a function of the time since its epoch, whether the contention period is
active; inside an active period the load process is busy for ``intensity`` of every
``slot_s`` (a duty cycle). The load process is pinned (``os.sched_setaffinity``) to the edge's
core, so the edge and the load share one CPU the way a phone's drafting thread shares it with
a foreground app.

    none                      never busy
    sustained[:I]             busy from ``start_s`` on, at intensity I (default 1.0)
    burst:ON:OFF[:I]          ON seconds busy, OFF seconds idle, repeated (starts with OFF
                              when ``start_s`` > 0, with ON otherwise)
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from dataclasses import dataclass

from rapid.core.errors import OptionError, RapidError


@dataclass(slots=True, frozen=True)
class Schedule:
    kind: str = "none"  # none | sustained | burst
    intensity: float = 1.0  # fraction of each slot the load is busy while active
    on_s: float = 0.0  # burst: active period
    off_s: float = 0.0  # burst: idle period
    start_s: float = 0.0  # nothing before this (seconds after the epoch)
    slot_s: float = 0.05  # duty-cycle slot

    def __post_init__(self) -> None:
        if self.kind not in ("none", "sustained", "burst"):
            raise ValueError(f"unknown schedule kind {self.kind!r}")
        if not 0.0 <= self.intensity <= 1.0:
            raise ValueError(f"intensity must be in [0, 1], got {self.intensity}")
        if self.kind == "burst" and (self.on_s <= 0 or self.off_s < 0):
            raise ValueError("burst needs on_s > 0 and off_s >= 0")

    @property
    def name(self) -> str:
        if self.kind == "none":
            return "none"
        i = "" if self.intensity == 1.0 else f":{self.intensity:g}"
        if self.kind == "sustained":
            return f"sustained{i}"
        return f"burst:{self.on_s:g}:{self.off_s:g}{i}"

    def active(self, t: float) -> bool:
        """Is the contention period on at ``t`` seconds after the epoch?"""
        if self.kind == "none" or t < self.start_s or self.intensity <= 0:
            return False
        if self.kind == "sustained":
            return True
        return (t - self.start_s) % (self.on_s + self.off_s) < self.on_s

    def busy(self, t: float) -> bool:
        """Is the load spinning at ``t`` (active period and inside the duty cycle)?"""
        if not self.active(t):
            return False
        return (t % self.slot_s) < self.intensity * self.slot_s

    def load_fraction(self, t0: float, t1: float, n: int = 64) -> float:
        """Mean of busy() over [t0, t1] (n samples): the intensity seen by a round."""
        if t1 <= t0:
            return float(self.active(t0)) * self.intensity
        return sum(self.active(t0 + (t1 - t0) * (k + 0.5) / n) for k in range(n)) / n * self.intensity

    def periods(self, horizon: float) -> list[tuple[float, float]]:
        """Active periods intersecting [0, horizon] (for shading plots)."""
        if self.kind == "none" or self.intensity <= 0:
            return []
        if self.kind == "sustained":
            return [(self.start_s, horizon)] if horizon > self.start_s else []
        out, t = [], self.start_s
        while t < horizon:
            out.append((t, min(t + self.on_s, horizon)))
            t += self.on_s + self.off_s
        return out


def schedule_kind(name: str) -> str:
    """The kind of a schedule's name, its parameters dropped: ``burst:4:4`` → ``burst``."""
    return name.split(":")[0]


def parse_schedule(spec: str) -> Schedule:
    """``none`` | ``sustained[:I]`` | ``burst:ON:OFF[:I]`` (see the module docstring)."""
    parts = spec.strip().split(":")
    kind = parts[0]
    try:
        if kind == "none" and len(parts) == 1:
            return Schedule()
        if kind == "sustained" and len(parts) <= 2:
            return Schedule("sustained", float(parts[1]) if len(parts) == 2 else 1.0)
        if kind == "burst" and len(parts) in (3, 4):
            return Schedule("burst", float(parts[3]) if len(parts) == 4 else 1.0, float(parts[1]), float(parts[2]))
    except ValueError as e:
        raise OptionError(f"bad contention schedule {spec!r}: {e}") from None
    raise OptionError(f"bad contention schedule {spec!r}; use none, sustained[:I] or burst:ON:OFF[:I]")


def pin(cpus: set[int] | None, pid: int = 0) -> bool:
    """Pin ``pid`` to ``cpus``; False where affinity is not supported."""
    if not cpus or not hasattr(os, "sched_setaffinity"):
        return False
    try:
        os.sched_setaffinity(pid, cpus)
        return True
    except OSError:
        return False


def _spin(seconds: float, work) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        work()


def _follow(epoch, stop, sched: Schedule, work) -> None:
    """Run ``work`` in the schedule's busy slots (from each epoch) until ``stop`` is set or the
    process that started the load is gone: a bench stopped by a signal runs no ``close()`` (and
    ``daemon`` only reaps at a normal exit), and its load went on spinning on the edge's core,
    under every later run on the machine (2026-12-07: the no-load cells of the next bench ran
    loaded)."""
    parent = os.getppid()
    while not stop.is_set() and os.getppid() == parent:
        e = epoch.value
        if e < 0:
            time.sleep(0.01)
            continue
        if sched.busy(time.monotonic() - e):
            _spin(min(0.005, sched.slot_s), work)
        else:
            time.sleep(0.002)


def _load_main(epoch, stop, cpus, sched: Schedule) -> None:  # runs in the load process
    os.environ["OMP_NUM_THREADS"] = "1"
    pin(set(cpus) if cpus else None)
    import numpy as np

    a = np.random.default_rng(0).standard_normal((96, 96))
    b = a.T.copy()
    # a small matmul: keeps the core's ALUs and caches busy, not only the scheduler
    _follow(epoch, stop, sched, lambda: a @ b)


def load_device_for(engine_device: str, requested: str = "auto") -> str:
    """Where the contention load runs: the edge engine's device unless ``requested`` says."""
    if requested != "auto":
        return requested
    d = engine_device.lower()
    return "cuda" if "cuda" in d or "tensorrt" in d else "cpu"


def gpu_load_available() -> tuple[bool, str]:
    """(True, "") when a CUDA device can run the GPU load (torch with CUDA), else (False, why)."""
    try:
        import torch
    except ImportError:
        return False, "the GPU load needs torch with CUDA (pip install torch for your device)"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA device"
    return True, ""


def _gpu_load_main(epoch, stop, cpus, sched: Schedule, n: int = 2048) -> None:  # runs in the load process
    """The GPU edge's load: fp16 matmuls on the edge's GPU in the busy slots (one kernel at a
    time, synchronised, so the busy fraction is the schedule's), the host thread on ``cpus``."""
    os.environ["OMP_NUM_THREADS"] = "1"
    pin(set(cpus) if cpus else None)
    import torch

    a = torch.randn(n, n, device="cuda", dtype=torch.float16)
    b = torch.randn(n, n, device="cuda", dtype=torch.float16)

    def work() -> None:
        a @ b
        torch.cuda.synchronize()

    _follow(epoch, stop, sched, work)


class LoadProcess:
    """A co-running load process following ``schedule`` from each ``start_epoch()``.

    ``device="cpu"`` spins on the edge's cores; ``device="cuda"`` runs matmuls on the edge's GPU
    (a GPU edge such as Jetson Orin drafts on the GPU, so that is where contention hurts).
    """

    def __init__(self, schedule: Schedule, cpus: set[int] | None = None, device: str = "cpu") -> None:
        if device not in ("cpu", "cuda"):
            raise ValueError(f"load device must be 'cpu' or 'cuda', got {device!r}")
        if device == "cuda" and schedule.kind != "none":
            ok, why = gpu_load_available()
            if not ok:
                raise RapidError(f"GPU contention load: {why}")
        self.schedule = schedule
        self.device = device
        ctx = mp.get_context("spawn")
        self._epoch = ctx.Value("d", -1.0)
        self._stop = ctx.Event()
        self._proc = None
        if schedule.kind != "none":
            target = _gpu_load_main if device == "cuda" else _load_main
            self._proc = ctx.Process(target=target, args=(self._epoch, self._stop, sorted(cpus or []), schedule),
                                     daemon=True, name="rapid-bench-load")
            self._proc.start()

    def start_epoch(self) -> float:
        """Restart the schedule now; returns the epoch (time.monotonic())."""
        now = time.monotonic()
        self._epoch.value = now
        return now

    def pause(self) -> None:
        self._epoch.value = -1.0

    def close(self) -> None:
        self._stop.set()
        if self._proc is not None:
            self._proc.join(timeout=5)
            if self._proc.is_alive():
                self._proc.kill()
            self._proc = None

    def __enter__(self) -> LoadProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
