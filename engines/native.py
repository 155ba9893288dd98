"""ctypes bindings of the native KV-cache kernels (``engines/kvops``), with numpy fallbacks.

A KV buffer is a C-contiguous array whose sequence axis is ``axis`` (default ``-2``, i.e.
``[..., seq, inner]``); it is viewed, without copying, as ``[outer, seq_cap, inner]`` where
``outer`` is the product of the axes before the sequence axis and ``inner`` of those after it.

- :func:`gather_rows` — for i in order: ``buf[..., dst[i], :] = buf[..., src[i], :]``
  (*sequential* semantics). In-place compaction (``dst`` strictly ascending and
  ``dst[i] <= src[i]``) therefore equals the snapshot move ``new[dst[i]] = old[src[i]]``.
- :func:`move_rows` / :func:`compact` — snapshot semantics for any index list (the native
  kernel when it gives the same result, numpy otherwise).
- :func:`copy_range` — ``dst[..., d:d+n, :] = src[..., s:s+n, :]`` (memmove semantics).
- :func:`bind` — a buffer checked once, for repeated :meth:`BoundKV.gather` calls.

Each takes ``backend="auto" | "native" | "numpy"``; ``auto`` uses the library when it loads
and :func:`gather_rows_numpy` / :func:`copy_range_numpy` (identical semantics) otherwise.

Libraries are searched in: a folder given to :func:`set_library_dir` (or :func:`build`),
``$RAPID_KVOPS_DIR``, ``<repo>/build/kvops``, then next to this module. Build them with
``cmake -S . -B build/kvops && cmake --build build/kvops -j`` or :func:`build`.

The CUDA library (``librapid_kvops_cuda``) takes device pointers and host index arrays; see
:class:`CudaKVOps` and :func:`selftest_cuda`. ``librapid_kvops_cuda_emu`` exports the same ABI
running the CUDA planner and kernel bodies serially on the host (tests only).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import operator
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from rapid.errors import RapidError

__all__ = [
    "BoundKV",
    "KVOpsBuildError",
    "bind",
    "CudaKVOps",
    "build",
    "compact",
    "copy_range",
    "copy_range_numpy",
    "cpu_available",
    "cpu_status",
    "cuda_built",
    "cuda_device_count",
    "cuda_library_path",
    "cuda_ops",
    "cuda_status",
    "gather_rows",
    "gather_rows_numpy",
    "library_path",
    "move_rows",
    "reload",
    "search_dirs",
    "selftest_cuda",
    "set_library_dir",
]

ABI_VERSION = 1
CUDA_CHUNK = 384  # RAPID_KV_CUDA_CHUNK: moves per kernel launch

OK = 0
ERR_INDEX = -1
ERR_ARG = -2
ERR_OVERLAP = -3
ERR_CUDA = -4
ERR_NOMEM = -5

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_BUILD_DIR = REPO_ROOT / "build" / "kvops"

CPU_LIB = "rapid_kvops"
CUDA_LIB = "rapid_kvops_cuda"
CUDA_EMU_LIB = "rapid_kvops_cuda_emu"

_SUFFIX = {2: "f16", 4: "f32", 8: "f64"}


class KVOpsBuildError(RapidError):
    """Building the native KV kernels failed (or cmake is missing)."""


# ------------------------------------------------------------------------------- loading --

_lock = threading.Lock()
_loaded: dict[str, tuple[ctypes.CDLL | None, str]] = {}
_override_dir: Path | None = None


def _lib_filename(name: str) -> str:
    if sys.platform == "win32":
        return f"{name}.dll"
    if sys.platform == "darwin":
        return f"lib{name}.dylib"
    return f"lib{name}.so"


def search_dirs() -> list[Path]:
    """Folders searched for the libraries, in order."""
    dirs: list[Path] = []
    if _override_dir is not None:
        dirs.append(_override_dir)
    env = os.environ.get("RAPID_KVOPS_DIR")
    if env:
        dirs.append(Path(env))
    dirs += [DEFAULT_BUILD_DIR, Path(__file__).resolve().parent]
    return dirs


def set_library_dir(path: str | os.PathLike[str] | None) -> None:
    """Search ``path`` first from now on (None: back to the default order); reloads."""
    global _override_dir
    _override_dir = None if path is None else Path(path)
    reload()


def reload() -> None:
    """Forget loaded libraries so the next call searches again (after a build)."""
    global _cpu_fns
    with _lock:
        _loaded.clear()
        _cpu_fns = None


def _find(name: str) -> Path | None:
    fname = _lib_filename(name)
    for d in search_dirs():
        p = d / fname
        if p.is_file():
            return p
    return None


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


def _load(name: str) -> tuple[ctypes.CDLL | None, str]:
    global _cpu_fns
    with _lock:
        hit = _loaded.get(name)
        if hit is not None:
            return hit
        path = _find(name)
        if path is None:
            where = ", ".join(str(d) for d in search_dirs())
            res: tuple[ctypes.CDLL | None, str] = (
                None, f"{_lib_filename(name)} not found (searched {where}); "
                "build it with `cmake -S . -B build/kvops && cmake --build build/kvops` "
                "or rapid.engines.native.build()")
        else:
            try:
                lib = ctypes.CDLL(str(path))
                _bind(lib, name)
                ver_fn = (lib.rapid_kvops_abi_version if name == CPU_LIB
                          else lib.rapid_kvops_cuda_abi_version)
                ver = ver_fn()
                if ver != ABI_VERSION:
                    res = (None, f"{path}: ABI version {ver}, expected {ABI_VERSION}; rebuild it")
                else:
                    res = (lib, f"loaded {path}")
                    if name == CPU_LIB:
                        _cpu_fns = _CpuFns(lib)
            except OSError as e:
                res = (None, f"{path} failed to load: {e}")
            except AttributeError as e:
                res = (None, f"{path} lacks a symbol ({e}); rebuild it")
        _loaded[name] = res
        return res


def library_path() -> Path | None:
    """Path of the CPU library file if one is found (loadable or not)."""
    return _find(CPU_LIB)


def cuda_library_path() -> Path | None:
    """Path of the CUDA library file if one is found (loadable or not)."""
    return _find(CUDA_LIB)


def cpu_available() -> bool:
    """True when the CPU kernel library is found and loads."""
    return _load(CPU_LIB)[0] is not None


def cpu_status() -> str:
    return _load(CPU_LIB)[1]


def cuda_built() -> bool:
    """True when the CUDA kernel library is present and loads (cudart found; no GPU needed)."""
    return _load(CUDA_LIB)[0] is not None


def cuda_status() -> str:
    """Why :func:`cuda_built` is what it is, plus the device count when the library loads."""
    lib, msg = _load(CUDA_LIB)
    if lib is None:
        return msg
    n, err = _device_count(lib)
    if err:
        return f"{msg}; no usable GPU: {err}"
    return f"{msg}; {n} CUDA device(s)"


def _device_count(lib: ctypes.CDLL) -> tuple[int, str]:
    c = ctypes.c_int(0)
    rc = lib.rapid_kv_cuda_device_count(ctypes.byref(c))
    if rc != 0:
        return 0, lib.rapid_kv_cuda_last_error_string().decode(errors="replace")
    if c.value == 0:
        return 0, "no CUDA device"
    return c.value, ""


def cuda_device_count() -> int:
    """Number of CUDA devices the CUDA library sees (0 without library, driver or GPU)."""
    lib = _load(CUDA_LIB)[0]
    return 0 if lib is None else _device_count(lib)[0]


# ------------------------------------------------------------------------------ helpers --

_I64 = np.dtype(np.int64)
_itemsize_cache: dict[np.dtype, int] = {}


def _itemsize_of(dtype) -> int:
    """Bytes per element of a supported KV dtype, else ValueError."""
    try:
        return _itemsize_cache[dtype]
    except (KeyError, TypeError):
        pass
    dt = np.dtype(dtype)
    if (dt.kind == "f" and dt.itemsize in _SUFFIX) or dt == np.uint16 or dt.name == "bfloat16":
        _itemsize_cache[dt] = dt.itemsize
        return dt.itemsize
    raise ValueError(f"unsupported KV dtype {dt}; expected float16, bfloat16 (or uint16 bits), "
                     "float32 or float64")


def _layout(buf: np.ndarray, axis: int, what: str = "buf",
            writeable: bool = True) -> tuple[int, int, int]:
    """``(outer, seq_cap, inner)`` of ``buf`` viewed around ``axis``; no copy, else ValueError."""
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{what} must be a numpy.ndarray, got {type(buf).__name__}")
    _itemsize_of(buf.dtype)
    shape = buf.shape
    nd = len(shape)
    if nd < 2:
        raise ValueError(f"{what} must have ndim >= 2 ([..., seq, inner]), got shape {shape}")
    ax = operator.index(axis)
    if not -nd <= ax < nd:
        raise ValueError(f"axis {axis} out of range for {what} of ndim {nd}")
    ax %= nd
    flags = buf.flags
    if not flags.c_contiguous:
        raise ValueError(
            f"{what} (shape {shape}, strides {buf.strides}) is not C-contiguous, so it cannot "
            "be viewed as [outer, seq_cap, inner] without a copy")
    if writeable and not flags.writeable:
        raise ValueError(f"{what} is read-only")
    return math.prod(shape[:ax]), shape[ax], math.prod(shape[ax + 1:])


def _as_index(x: Sequence[int] | np.ndarray, what: str) -> np.ndarray:
    if type(x) is np.ndarray and x.dtype is _I64 and x.ndim == 1 and x.flags.c_contiguous:
        return x  # fast path
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{what} must be 1-D, got shape {a.shape}")
    if a.dtype.kind not in "iu":
        if a.size == 0:
            return np.empty(0, np.int64)
        raise ValueError(f"{what} must hold integers, got dtype {a.dtype}")
    if a.dtype.kind == "u" and a.size and a.max() > np.iinfo(np.int64).max:
        raise ValueError(f"{what} has an index beyond int64")
    return np.ascontiguousarray(a, dtype=np.int64)


def _index_pair(src, dst) -> tuple[np.ndarray, np.ndarray]:
    s = _as_index(src, "src")
    d = _as_index(dst, "dst")
    if s.shape != d.shape:
        raise ValueError(f"src and dst differ in length: {s.size} != {d.size}")
    return s, d


def _addr(a: np.ndarray) -> int:
    """Address of a C-contiguous array's data (c_char.from_buffer is ~3x cheaper than
    ``a.ctypes.data``, but needs a writable, non-empty buffer)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError, BufferError):
        return a.ctypes.data


def _check_indices(s: np.ndarray, d: np.ndarray, cap: int) -> None:
    for name, a in (("src", s), ("dst", d)):
        if a.size:
            bad = (a < 0) | (a >= cap)
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError(f"{name}[{i}] = {int(a[i])} outside [0, {cap}) (sequence axis)")


def _view3(buf: np.ndarray, outer: int, cap: int, inner: int) -> np.ndarray:
    v = buf.view()
    v.shape = (outer, cap, inner)  # raises instead of copying
    return v


class _CpuFns:
    __slots__ = ("gather", "copy_range")

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.gather = {k: getattr(lib, f"rapid_kv_gather_{v}") for k, v in _SUFFIX.items()}
        self.copy_range = {k: getattr(lib, f"rapid_kv_copy_range_{v}")
                           for k, v in _SUFFIX.items()}


_cpu_fns: _CpuFns | None = None


def _pick(backend: str) -> _CpuFns | None:
    """The CPU kernels for ``backend``, or None for numpy."""
    if backend == "auto" and _cpu_fns is not None:
        return _cpu_fns
    if backend == "numpy":
        return None
    if backend not in ("auto", "native"):
        raise ValueError(f"backend must be 'auto', 'native' or 'numpy', got {backend!r}")
    fns = _cpu_fns
    if fns is None:
        lib, msg = _load(CPU_LIB)
        if lib is None:
            if backend == "native":
                raise RuntimeError(f"native KV kernels unavailable: {msg}")
            return None
        fns = _CpuFns(lib)
    return fns


def _raise_rc(rc: int, op: str) -> None:
    if rc == ERR_INDEX:
        raise ValueError(f"{op}: index out of range")
    if rc == ERR_ARG:
        raise ValueError(f"{op}: invalid argument")
    if rc == ERR_NOMEM:
        raise MemoryError(f"{op}: out of host memory")
    raise RuntimeError(f"{op}: native kernel failed with code {rc}")


# ---------------------------------------------------------------------- numpy reference --

def _vector_safe(s: np.ndarray, d: np.ndarray, cap: int) -> bool:
    """True when the snapshot ``v[:, d] = v[:, s]`` equals the sequential moves."""
    n = s.size
    if n <= 1:
        return True
    if bool(np.all(d[1:] > d[:-1])) and bool(np.all(d <= s)):
        return True  # in-place compaction
    if np.unique(d).size != n:
        return False
    first_write = np.full(cap, n, dtype=np.int64)
    first_write[d] = np.arange(n)
    return not bool(np.any(first_write[s] < np.arange(n)))


def gather_rows_numpy(buf: np.ndarray, src, dst, axis: int = -2) -> None:
    """Reference implementation of :func:`gather_rows` (same semantics and errors)."""
    outer, cap, inner = _layout(buf, axis)
    s, d = _index_pair(src, dst)
    _check_indices(s, d, cap)
    if s.size == 0 or buf.size == 0:
        return
    v = _view3(buf, outer, cap, inner)
    if _vector_safe(s, d, cap):
        v[:, d] = v[:, s]
    else:
        for si, di in zip(s.tolist(), d.tolist(), strict=True):
            if si != di:
                v[:, di] = v[:, si]


def _range_args(src_buf, dst_buf, src_start, dst_start, length, axis):
    so, scap, si = _layout(src_buf, axis, "src_buf", writeable=False)
    do, dcap, di = _layout(dst_buf, axis, "dst_buf")
    if src_buf.dtype != dst_buf.dtype:
        raise ValueError(f"dtype mismatch: {src_buf.dtype} vs {dst_buf.dtype}")
    if (so, si) != (do, di):
        raise ValueError(f"buffers differ outside the sequence axis: [outer, inner] = "
                         f"{[so, si]} vs {[do, di]}")
    ss, ds, n = operator.index(src_start), operator.index(dst_start), operator.index(length)
    if n < 0:
        raise ValueError(f"length {n} < 0")
    if not 0 <= ss <= scap - n:
        raise ValueError(f"source range [{ss}, {ss + n}) outside [0, {scap})")
    if not 0 <= ds <= dcap - n:
        raise ValueError(f"destination range [{ds}, {ds + n}) outside [0, {dcap})")
    return so, scap, dcap, si, ss, ds, n


def copy_range_numpy(src_buf: np.ndarray, dst_buf: np.ndarray, src_start: int, dst_start: int,
                     length: int, axis: int = -2) -> None:
    """Reference implementation of :func:`copy_range` (numpy itself buffers overlapping copies)."""
    outer, scap, dcap, inner, ss, ds, n = _range_args(src_buf, dst_buf, src_start, dst_start,
                                                      length, axis)
    if n == 0 or outer == 0 or inner == 0:
        return
    sv = _view3(src_buf, outer, scap, inner)
    dv = _view3(dst_buf, outer, dcap, inner)
    dv[:, ds:ds + n] = sv[:, ss:ss + n]


# ---------------------------------------------------------------------------- public API --

def gather_rows(buf: np.ndarray, src, dst, axis: int = -2, *, backend: str = "auto") -> None:
    """For i in order: ``buf[..., dst[i], :] = buf[..., src[i], :]`` along ``axis``, in place.

    Sequential semantics: move i sees moves 0..i-1, so in-place compaction with strictly
    ascending ``dst`` and ``dst[i] <= src[i]`` is safe. Indices outside ``[0, seq_cap)`` raise
    ValueError and leave ``buf`` unchanged. ``buf``: C-contiguous float16/bfloat16/uint16,
    float32 or float64 array of ndim >= 2.
    """
    outer, cap, inner = _layout(buf, axis)
    fns = _pick(backend)
    if fns is None:
        gather_rows_numpy(buf, src, dst, axis)
        return
    s, d = _index_pair(src, dst)
    n = s.size
    if n == 0:
        return
    rc = fns.gather[buf.itemsize](_addr(buf), outer, cap, inner, _addr(s), _addr(d), n)
    if rc != 0:
        if rc == ERR_INDEX:
            _check_indices(s, d, cap)
        _raise_rc(rc, "gather_rows")


def copy_range(src_buf: np.ndarray, dst_buf: np.ndarray, src_start: int, dst_start: int,
               length: int, axis: int = -2, *, backend: str = "auto") -> None:
    """``dst_buf[..., dst_start:+length, :] = src_buf[..., src_start:+length, :]`` along ``axis``.

    memmove semantics (overlap within one buffer is fine). Both buffers must share dtype and
    the shape outside the sequence axis; their capacities may differ (boundary save/restore).
    """
    outer, scap, dcap, inner, ss, ds, n = _range_args(src_buf, dst_buf, src_start, dst_start,
                                                      length, axis)
    fns = _pick(backend)
    if fns is not None:
        if n == 0:
            return
        rc = fns.copy_range[dst_buf.itemsize](_addr(src_buf), _addr(dst_buf), outer, scap, dcap,
                                              inner, ss, ds, n)
        if rc == 0:
            return
        if rc != ERR_OVERLAP:
            _raise_rc(rc, "copy_range")
        # Views into one buffer with different layouts: numpy buffers the overlap for us.
    copy_range_numpy(src_buf, dst_buf, ss, ds, n, axis)


def move_rows(buf: np.ndarray, src, dst, axis: int = -2, *, backend: str = "auto") -> None:
    """Snapshot move: ``new[..., dst[i], :] = old[..., src[i], :]`` for all i at once.

    ``dst`` must not repeat. Uses the native sequential kernel whenever it gives the same
    result (no ``src[i]`` equals an earlier ``dst[j]``, e.g. compaction), numpy otherwise.
    """
    outer, cap, inner = _layout(buf, axis)
    s, d = _index_pair(src, dst)
    _check_indices(s, d, cap)
    if np.unique(d).size != d.size:
        raise ValueError("move_rows: dst has repeated indices")
    if _vector_safe(s, d, cap):
        gather_rows(buf, s, d, axis, backend=backend)
    elif buf.size:
        v = _view3(buf, outer, cap, inner)
        v[:, d] = v[:, s]


def compact(buf: np.ndarray, src, dst_start: int, axis: int = -2, *,
            backend: str = "auto") -> None:
    """Move entries ``src`` to ``dst_start, dst_start+1, …`` (snapshot semantics)."""
    s = _as_index(src, "src")
    d0 = operator.index(dst_start)
    move_rows(buf, s, np.arange(d0, d0 + s.size, dtype=np.int64), axis, backend=backend)


class BoundKV:
    """A KV buffer checked once for repeated in-place moves (the engine hot path).

    ``bind(buf).gather(src, dst)`` equals ``gather_rows(buf, src, dst)`` minus the per-call
    layout checks and lookups. Holds a reference to ``buf``; do not resize it in place.
    """

    __slots__ = ("buf", "axis", "outer", "cap", "inner", "_fn", "_ptr")

    def __init__(self, buf: np.ndarray, axis: int = -2, *, backend: str = "auto") -> None:
        self.buf = buf
        self.axis = axis
        self.outer, self.cap, self.inner = _layout(buf, axis)
        fns = _pick(backend)
        self._fn = None if fns is None or buf.size == 0 else fns.gather[buf.itemsize]
        self._ptr = _addr(buf) if self._fn is not None else 0

    def gather(self, src, dst) -> None:
        """For i in order: ``buf[..., dst[i], :] = buf[..., src[i], :]`` (see gather_rows)."""
        fn = self._fn
        if fn is None:
            gather_rows_numpy(self.buf, src, dst, self.axis)
            return
        s, d = _index_pair(src, dst)
        n = s.size
        if n == 0:
            return
        rc = fn(self._ptr, self.outer, self.cap, self.inner, _addr(s), _addr(d), n)
        if rc != 0:
            if rc == ERR_INDEX:
                _check_indices(s, d, self.cap)
            _raise_rc(rc, "gather_rows")


def bind(buf: np.ndarray, axis: int = -2, *, backend: str = "auto") -> BoundKV:
    """See :class:`BoundKV`."""
    return BoundKV(buf, axis, backend=backend)


# ------------------------------------------------------------------------------------ CUDA --

class CudaKVOps:
    """The CUDA ABI on raw pointers: device buffers, host index arrays, ``stream`` a
    ``cudaStream_t`` as int (0 = legacy default stream). Work is enqueued asynchronously."""

    def __init__(self, lib: ctypes.CDLL, path: str = "") -> None:
        self._lib = lib
        self.path = path
        self.emulation = bool(lib.rapid_kv_cuda_is_emulation())

    def _check(self, rc: int, op: str) -> None:
        if rc == ERR_CUDA:
            err = self._lib.rapid_kv_cuda_last_error_string().decode(errors="replace")
            raise RuntimeError(f"{op}: CUDA error: {err}")
        if rc != 0:
            _raise_rc(rc, op)

    def device_count(self) -> tuple[int, str]:
        """``(count, reason)``; reason is empty when a device is usable."""
        return _device_count(self._lib)

    def gather(self, ptr: int, outer: int, seq_cap: int, inner: int, dtype, src, dst,
               stream: int = 0) -> None:
        s, d = _index_pair(src, dst)
        fn = getattr(self._lib, f"rapid_kv_gather_cuda_{_SUFFIX[_itemsize_of(dtype)]}")
        self._check(fn(ptr, outer, seq_cap, inner, s.ctypes.data, d.ctypes.data, s.size,
                       stream or None), "gather_cuda")

    def copy_range(self, src_ptr: int, dst_ptr: int, outer: int, src_cap: int, dst_cap: int,
                   inner: int, dtype, src_start: int, dst_start: int, length: int,
                   stream: int = 0) -> None:
        fn = getattr(self._lib, f"rapid_kv_copy_range_cuda_{_SUFFIX[_itemsize_of(dtype)]}")
        self._check(fn(src_ptr, dst_ptr, outer, src_cap, dst_cap, inner, src_start, dst_start,
                       length, stream or None), "copy_range_cuda")

    def malloc(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        self._check(self._lib.rapid_kv_cuda_malloc(ctypes.byref(p), nbytes), "cuda_malloc")
        return int(p.value or 0)

    def free(self, ptr: int) -> None:
        self._check(self._lib.rapid_kv_cuda_free(ptr), "cuda_free")

    def upload(self, ptr: int, arr: np.ndarray) -> None:
        a = np.ascontiguousarray(arr)
        self._check(self._lib.rapid_kv_cuda_memcpy(ptr, a.ctypes.data, a.nbytes), "cuda_memcpy")

    def download(self, ptr: int, like: np.ndarray) -> np.ndarray:
        out = np.empty_like(like, order="C")
        self._check(self._lib.rapid_kv_cuda_memcpy(out.ctypes.data, ptr, out.nbytes),
                    "cuda_memcpy")
        return out

    def synchronize(self, stream: int = 0) -> None:
        self._check(self._lib.rapid_kv_cuda_stream_synchronize(stream or None),
                    "cuda_stream_synchronize")


def cuda_ops(*, emulation: bool = False) -> CudaKVOps:
    """The CUDA kernels (or, with ``emulation=True``, their serial host emulation)."""
    name = CUDA_EMU_LIB if emulation else CUDA_LIB
    lib, msg = _load(name)
    if lib is None:
        raise RuntimeError(f"{name} unavailable: {msg}")
    return CudaKVOps(lib, msg)


def _selftest_cases(rng: np.random.Generator):
    """(dtype, shape [outer, cap, inner], src, dst) gather cases covering every plan mode."""
    cases = []
    for dt in (np.float16, np.float32, np.float64):
        for outer, cap, inner in ((96, 256, 64), (3, 64, 3), (5, 2048, 8), (1, 9, 1)):
            m = min(cap // 2, 48)
            base = cap - 2 * m
            src = np.sort(rng.choice(np.arange(base, cap), size=m, replace=False))
            cases.append((dt, (outer, cap, inner), src, base + np.arange(m)))  # compaction
            cases.append((dt, (outer, cap, inner), np.arange(m), np.arange(m) + 1))  # shift up
            perm = rng.permutation(cap)
            cases.append((dt, (outer, cap, inner), perm[:m], perm[m:2 * m]))  # disjoint
            cases.append((dt, (outer, cap, inner), rng.integers(0, cap, 3 * m),
                          rng.integers(0, cap, 3 * m)))  # arbitrary, with repeats
        big = 2 * CUDA_CHUNK + 17  # several launches
        cases.append((dt, (4, 4096, 16), np.arange(1, big + 1) * 2 + 7, np.arange(big) * 2))
        cases.append((dt, (4, 4096, 16), np.arange(big) * 3 + 5, np.arange(big)))  # compaction
        cases.append((dt, (4, 4096, 16), rng.integers(0, 4096, big), rng.integers(0, 4096, big)))
    return cases


def selftest_cuda(*, emulation: bool = False, seed: int = 0) -> str:
    """Run the CUDA gather/copy kernels on a GPU and compare them with the CPU kernels.

    Needs only the CUDA library (it exports malloc/memcpy helpers, so neither pycuda nor
    cuda-python is required). Returns ``"ok: ..."`` or ``"skipped: <reason>"``; raises
    RuntimeError on a mismatch. ``emulation=True`` runs the host emulation library instead.
    """
    name = CUDA_EMU_LIB if emulation else CUDA_LIB
    lib, msg = _load(name)
    if lib is None:
        return f"skipped: {msg}"
    ops = CudaKVOps(lib, msg)
    n_dev, why = ops.device_count()
    if n_dev == 0:
        return f"skipped: no CUDA driver/GPU ({why})"
    ref_backend = "native" if cpu_available() else "numpy"
    rng = np.random.default_rng(seed)
    checked = 0
    failures: list[str] = []

    def run_case(label: str, host: np.ndarray, expect: np.ndarray, launch) -> None:
        nonlocal checked
        ptr = ops.malloc(host.nbytes)
        try:
            ops.upload(ptr, host)
            launch(ptr)
            ops.synchronize()
            got = ops.download(ptr, host)
        finally:
            ops.free(ptr)
        checked += 1
        if not np.array_equal(got.view(np.uint8), expect.view(np.uint8)):
            failures.append(label)

    for k, (dt, shape, src, dst) in enumerate(_selftest_cases(rng)):
        host = rng.standard_normal(shape).astype(dt)
        expect = host.copy()
        gather_rows(expect, src, dst, backend=ref_backend)
        run_case(f"gather#{k} {np.dtype(dt).name} {shape} n={len(src)}", host, expect,
                 lambda p, sh=shape, d=dt, s=src, t=dst: ops.gather(p, *sh, d, s, t))

    outer, cap, inner = 6, 128, 24
    for dt in (np.float16, np.float32, np.float64):
        for ss, ds, n in ((40, 10, 50), (10, 40, 50), (0, 64, 64), (5, 5, 30), (100, 0, 28)):
            host = rng.standard_normal((outer, cap, inner)).astype(dt)
            expect = host.copy()
            copy_range(expect, expect, ss, ds, n, backend=ref_backend)
            run_case(f"copy_range in-place {np.dtype(dt).name} {ss}->{ds} n={n}", host, expect,
                     lambda p, d=dt, a=ss, b=ds, m=n: ops.copy_range(p, p, outer, cap, cap,
                                                                     inner, d, a, b, m))
        # between two buffers of different capacity (boundary save / restore)
        small = np.zeros((outer, 32, inner), dt)
        host = rng.standard_normal((outer, cap, inner)).astype(dt)
        expect = small.copy()
        copy_range(host, expect, 70, 3, 20, backend=ref_backend)
        src_ptr = ops.malloc(host.nbytes)
        try:
            ops.upload(src_ptr, host)
            run_case(f"copy_range between buffers {np.dtype(dt).name}", small, expect,
                     lambda p, d=dt, s=src_ptr: ops.copy_range(s, p, outer, cap, 32, inner,
                                                               d, 70, 3, 20))
        finally:
            ops.free(src_ptr)

    kind = "emulated device" if ops.emulation else f"{n_dev} CUDA device(s)"
    if failures:
        raise RuntimeError(f"CUDA KV kernels disagree with the CPU reference ({ref_backend}) in "
                           f"{len(failures)}/{checked} cases: {failures[:8]}")
    return f"ok: {checked} cases match the {ref_backend} reference on {kind}"


# ----------------------------------------------------------------------------------- build --

def build(source_dir: str | os.PathLike[str] | None = None,
          build_dir: str | os.PathLike[str] | None = None, *, cuda: bool | None = None,
          build_type: str = "Release", jobs: int | None = None,
          timeout: float | None = 1800) -> Path:
    """Configure and build the kernels with cmake; returns the build folder.

    ``cuda``: None lets CMake decide (CUDA when nvcc is found), False forces the CPU-only
    build. A build folder outside the default search path is searched first afterwards.
    Raises :class:`KVOpsBuildError` when cmake is missing or the build fails.
    """
    cmake = shutil.which("cmake")
    if cmake is None:
        raise KVOpsBuildError(
            "cmake not found on PATH: install cmake >= 3.18 and a C++17 compiler "
            "(e.g. `apt install cmake g++` or `pip install cmake`), or point RAPID_KVOPS_DIR "
            "at a folder holding prebuilt librapid_kvops")
    src = Path(source_dir) if source_dir is not None else REPO_ROOT
    if not (src / "CMakeLists.txt").is_file() or not (src / "engines" / "kvops").is_dir():
        raise KVOpsBuildError(f"{src} holds no kvops sources (CMakeLists.txt, engines/kvops)")
    out = Path(build_dir) if build_dir is not None else DEFAULT_BUILD_DIR
    out.mkdir(parents=True, exist_ok=True)
    configure = [cmake, "-S", str(src), "-B", str(out), f"-DCMAKE_BUILD_TYPE={build_type}"]
    if cuda is not None:
        configure.append(f"-DRAPID_KVOPS_CUDA={'ON' if cuda else 'OFF'}")
    compile_ = [cmake, "--build", str(out), "--config", build_type, "-j",
                str(jobs or os.cpu_count() or 1)]
    with _build_lock(out):
        for cmd in (configure, compile_):
            try:
                r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired as e:
                raise KVOpsBuildError(f"`{' '.join(cmd)}` timed out after {timeout}s") from e
            if r.returncode != 0:
                tail = (r.stdout + r.stderr)[-4000:]
                raise KVOpsBuildError(f"`{' '.join(cmd)}` failed ({r.returncode}):\n{tail}")
    if out.resolve() != DEFAULT_BUILD_DIR.resolve():
        set_library_dir(out)
    else:
        reload()
    return out


@contextlib.contextmanager
def _build_lock(folder: Path) -> Iterator[None]:
    """Exclusive lock on ``<folder>/.rapid_kvops.lock`` (POSIX; a no-op elsewhere), so
    concurrent test sessions do not run cmake in one build folder at once."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(folder / ".rapid_kvops.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
