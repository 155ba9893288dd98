"""Emulated tensorrt/pycuda for TrtEngine tests: host "device" memory, ONNX Runtime execution.

It checks what TensorRT and CUDA would check, and what they leave undefined:

- memory: every allocation is 256-byte aligned (cudaMalloc's guarantee) and registered; every
  copy (host↔device, 2-D, 3-D) stays inside live allocations; 2-D / 3-D rows fit their pitches
  and slice heights, and a copy's source and destination bytes do not overlap;
- ``set_input_shape``: False for an unknown input or a shape outside the active profile's
  [min, max] — the profiles are the ones ``rapid.export.trt_build`` asks a real build for;
- ``set_tensor_address``: False for an unknown tensor or an address not 256-byte aligned;
- ``execute_async_v3``: every input shape and every address set; T and P agree across the
  tensors and S = P + T; each binding's bytes inside one allocation; no output overlapping any
  other binding; a USER_MANAGED context has its scratch set (aligned, big enough, allocated);
  a STATIC context allocates its own scratch, as TensorRT does.

Tests steer it through ``Emulation.trt`` (refuse a named tensor's shape or address, override an
engine tensor's dtype) and read ``Emulation.memory`` (live device bytes, pinned bytes).
"""

from __future__ import annotations

import ctypes
import json
import shutil
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from trt_emulation_engine import ALIGN, fake_tensorrt, module

from rapid.engines import cuda
from rapid.engines.trt_engine import TrtEngine


class DeviceMemory:
    """The emulated GPU's allocations: host buffers, 256-byte aligned, tracked by address."""

    def __init__(self) -> None:
        self.live: dict[int, tuple[int, np.ndarray]] = {}  # ptr -> (bytes asked for, backing buffer)
        self.pinned = 0  # bytes of page-locked host memory handed out

    def alloc(self, nbytes: int) -> int:
        buf = np.zeros(int(nbytes) + ALIGN, np.uint8)
        ptr = -(-buf.ctypes.data // ALIGN) * ALIGN
        self.live[ptr] = (int(nbytes), buf)
        return ptr

    def free(self, ptr: int) -> None:
        assert self.live.pop(ptr, None) is not None, f"free of {ptr:#x}, not a live allocation"

    def device_bytes(self) -> int:
        return sum(n for n, _ in self.live.values())

    def check_inside(self, ptr: int, nbytes: int, what: str) -> None:
        if nbytes == 0:
            return
        ok = any(base <= ptr and ptr + nbytes <= base + n for base, (n, _) in self.live.items())
        assert ok, f"{what}: [{ptr:#x}, +{nbytes}) is not inside one live device allocation"


def _rows(base: int, pitch: int, slice_height: int, width: int, height: int, depth: int):
    return [(base + z * pitch * slice_height + y * pitch, width) for z in range(depth) for y in range(height)]


def _intersect(a, b) -> bool:
    """Brute force: any byte shared by two lists of (start, length) intervals."""
    lo_a, hi_a = min(s for s, _ in a), max(s + w for s, w in a)
    lo_b, hi_b = min(s for s, _ in b), max(s + w for s, w in b)
    if hi_a <= lo_b or hi_b <= lo_a:
        return False
    return any(s < t + v and t < s + w for s, w in a for t, v in b)


class _Alloc:
    mem: DeviceMemory  # set on the per-emulation subclass

    def __init__(self, nbytes):
        self.ptr = self.mem.alloc(nbytes)

    def __int__(self):
        return self.ptr

    def free(self):
        self.mem.free(self.ptr)


class _Ctx:
    def push(self):
        pass

    def detach(self):
        pass


class _Device:
    def __init__(self, n):
        self.n = n

    @staticmethod
    def count():
        return 1

    def name(self):
        return "emulated GPU"

    def retain_primary_context(self):
        return _Ctx()


class _Stream:
    handle = 0

    def synchronize(self):
        pass


class _Event:  # the emulated device finishes every copy and run at once
    def __init__(self, flags=0):
        pass

    def record(self, stream=None):
        pass

    def query(self):
        return True

    def synchronize(self):
        pass


class _Memcpy3D:
    """Memcpy2D and Memcpy3D: a 2-D copy is a 3-D copy of depth 1."""

    mem: DeviceMemory
    src_height = dst_height = depth = 1

    def set_src_device(self, p):
        self.src = int(p)

    def set_dst_device(self, p):
        self.dst = int(p)

    def __call__(self, stream=None):
        w, h, d = self.width_in_bytes, self.height, self.depth
        assert w <= min(self.src_pitch, self.dst_pitch), "copy rows wider than a pitch"
        assert d == 1 or h <= min(self.src_height, self.dst_height), "copy slices taller than a slice height"
        src = _rows(self.src, self.src_pitch, self.src_height, w, h, d)
        dst = _rows(self.dst, self.dst_pitch, self.dst_height, w, h, d)
        for start, n in src:
            self.mem.check_inside(start, n, "copy source")
        for start, n in dst:
            self.mem.check_inside(start, n, "copy destination")
        assert not _intersect(src, dst), "overlapping device copy (undefined in CUDA)"
        for (s, n), (t, _) in zip(src, dst, strict=True):
            ctypes.memmove(t, s, n)


def _fake_pycuda(mem: DeviceMemory) -> types.ModuleType:
    def htod(dst, src, stream=None):
        mem.check_inside(int(dst), src.nbytes, "htod destination")
        ctypes.memmove(int(dst), src.ctypes.data, src.nbytes)

    def dtoh(dst, src, stream=None):
        mem.check_inside(int(src), dst.nbytes, "dtoh source")
        ctypes.memmove(dst.ctypes.data, int(src), dst.nbytes)

    def pinned(shape, dtype):
        out = np.empty(shape, dtype)
        mem.pinned += out.nbytes
        return out

    drv = module("pycuda.driver")
    drv.Error = RuntimeError
    drv.init = lambda: None
    drv.Device, drv.Stream, drv.Event = _Device, _Stream, _Event
    drv.Memcpy2D = drv.Memcpy3D = type("Memcpy3D", (_Memcpy3D,), {"mem": mem})
    drv.Context = types.SimpleNamespace(pop=lambda: None)
    drv.event_flags = types.SimpleNamespace(DISABLE_TIMING=2)
    drv.mem_alloc = type("Alloc", (_Alloc,), {"mem": mem})
    drv.pagelocked_empty = pinned
    drv.memcpy_htod_async, drv.memcpy_dtoh_async = htod, dtoh
    pkg = module("pycuda")
    pkg.driver = drv
    return pkg


@dataclass
class Emulation:
    folder: Path
    trt: types.SimpleNamespace  # refuse_shape, refuse_address, dtype_override, contexts, executions
    memory: DeviceMemory


def install_trt_emulation(monkeypatch, export, tmp_path, kernels: bool = False) -> Emulation:
    """Copy the export with a stand-in draft.engine and swap in the emulated modules."""
    folder = tmp_path / "trt-export"
    shutil.copytree(export, folder)
    (folder / "draft.engine").write_bytes(b"emulated")
    manifest = json.loads((folder / "manifest.json").read_text())
    mem = DeviceMemory()
    pkg = _fake_pycuda(mem)
    trt = fake_tensorrt(folder / "draft.onnx", manifest, mem)
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", pkg.driver)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(cuda, "_drv", None)
    ops = None
    if kernels:
        from rapid.engines import native

        try:
            ops = native.cuda_ops(emulation=True)
        except RuntimeError as e:
            pytest.skip(f"librapid_kvops_cuda_emu unavailable: {e}")
    monkeypatch.setattr(TrtEngine, "_load_kvops", staticmethod(lambda: ops))
    return Emulation(folder, trt.state, mem)


def _install_trt_emulation(monkeypatch, export, tmp_path, kernels: bool):
    return install_trt_emulation(monkeypatch, export, tmp_path, kernels).folder
