"""The C ABI of the native KV kernels (``engines/kvops``), as seen from ctypes.

Owns what must match the C/CUDA sources exactly: :data:`ABI_VERSION`, the ``OK`` / ``ERR_*``
return codes, the library names and per-dtype symbol suffixes, the ctypes signatures bound on
load (:func:`_bind`), the CPU kernel table (:class:`_CpuFns`), turning a return code into a
Python exception (:func:`_raise_rc`) and the raw pointer of an array (:func:`_addr`).
Searching and loading the libraries is :mod:`rapid.engines.native`'s job.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np

ABI_VERSION = 1
CUDA_CHUNK = 384  # RAPID_KV_CUDA_CHUNK: moves per kernel launch

OK = 0
ERR_INDEX = -1
ERR_ARG = -2
ERR_OVERLAP = -3
ERR_CUDA = -4
ERR_NOMEM = -5

CPU_LIB = "rapid_kvops"
CUDA_LIB = "rapid_kvops_cuda"
CUDA_EMU_LIB = "rapid_kvops_cuda_emu"

_SUFFIX = {2: "f16", 4: "f32", 8: "f64"}


def _lib_filename(name: str) -> str:
    if sys.platform == "win32":
        return f"{name}.dll"
    if sys.platform == "darwin":
        return f"lib{name}.dylib"
    return f"lib{name}.so"


def _bind(lib: ctypes.CDLL, name: str) -> None:
    vp, i64, c_int = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    if name == CPU_LIB:
        lib.rapid_kvops_abi_version.restype = c_int
        lib.rapid_kvops_abi_version.argtypes = []
        for sfx in _SUFFIX.values():
            f = getattr(lib, f"rapid_kv_gather_{sfx}")
            f.restype, f.argtypes = c_int, [vp, i64, i64, i64, vp, vp, i64]
            f = getattr(lib, f"rapid_kv_copy_range_{sfx}")
            f.restype, f.argtypes = c_int, [vp, vp, i64, i64, i64, i64, i64, i64, i64]
        return
    lib.rapid_kvops_cuda_abi_version.restype = c_int
    lib.rapid_kvops_cuda_abi_version.argtypes = []
    lib.rapid_kv_cuda_is_emulation.restype = c_int
    lib.rapid_kv_cuda_is_emulation.argtypes = []
    for sfx in _SUFFIX.values():
        f = getattr(lib, f"rapid_kv_gather_cuda_{sfx}")
        f.restype, f.argtypes = c_int, [vp, i64, i64, i64, vp, vp, i64, vp]
        f = getattr(lib, f"rapid_kv_copy_range_cuda_{sfx}")
        f.restype, f.argtypes = c_int, [vp, vp, i64, i64, i64, i64, i64, i64, i64, vp]
    lib.rapid_kv_cuda_last_error_string.restype = ctypes.c_char_p
    lib.rapid_kv_cuda_last_error_string.argtypes = []
    lib.rapid_kv_cuda_device_count.restype = c_int
    lib.rapid_kv_cuda_device_count.argtypes = [ctypes.POINTER(ctypes.c_int)]
    lib.rapid_kv_cuda_malloc.restype = c_int
    lib.rapid_kv_cuda_malloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), i64]
    lib.rapid_kv_cuda_free.restype = c_int
    lib.rapid_kv_cuda_free.argtypes = [vp]
    lib.rapid_kv_cuda_memcpy.restype = c_int
    lib.rapid_kv_cuda_memcpy.argtypes = [vp, vp, i64]
    lib.rapid_kv_cuda_stream_synchronize.restype = c_int
    lib.rapid_kv_cuda_stream_synchronize.argtypes = [vp]


def _device_count(lib: ctypes.CDLL) -> tuple[int, str]:
    c = ctypes.c_int(0)
    rc = lib.rapid_kv_cuda_device_count(ctypes.byref(c))
    if rc != 0:
        return 0, lib.rapid_kv_cuda_last_error_string().decode(errors="replace")
    if c.value == 0:
        return 0, "no CUDA device"
    return c.value, ""


class _CpuFns:
    __slots__ = ("gather", "copy_range")

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.gather = {k: getattr(lib, f"rapid_kv_gather_{v}") for k, v in _SUFFIX.items()}
        self.copy_range = {k: getattr(lib, f"rapid_kv_copy_range_{v}")
                           for k, v in _SUFFIX.items()}


def _raise_rc(rc: int, op: str) -> None:
    if rc == ERR_INDEX:
        raise ValueError(f"{op}: index out of range")
    if rc == ERR_ARG:
        raise ValueError(f"{op}: invalid argument")
    if rc == ERR_NOMEM:
        raise MemoryError(f"{op}: out of host memory")
    raise RuntimeError(f"{op}: native kernel failed with code {rc}")


def _addr(a: np.ndarray) -> int:
    """Address of a C-contiguous array's data (c_char.from_buffer is ~3x cheaper than
    ``a.ctypes.data``, but needs a writable, non-empty buffer)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data
