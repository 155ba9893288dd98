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

This module owns library search and loading and the entry points that dispatch to a backend;
it re-exports the rest: ABI constants and ctypes signatures (:mod:`.kvops_abi`), argument
checks and numpy fallbacks (:mod:`.kvops_numpy`), the CUDA wrapper and self-test cases
(:mod:`.kvops_cuda`) and the cmake build (:mod:`.kvops_build`).
"""

from __future__ import annotations

import ctypes
import functools
import operator
import os
import threading
from pathlib import Path

import numpy as np

from rapid.engines.kvops_abi import (
    ABI_VERSION,
    CPU_LIB,
    CUDA_EMU_LIB,
    CUDA_LIB,
    ERR_INDEX,
    ERR_OVERLAP,
    _addr,
    _bind,
    _CpuFns,
    _device_count,
    _lib_filename,
    _raise_rc,
)
from rapid.engines.kvops_build import DEFAULT_BUILD_DIR, KVOpsBuildError, cmake_build
from rapid.engines.kvops_cuda import CudaKVOps, compare_with_reference
from rapid.engines.kvops_numpy import (
    _as_index,
    _check_indices,
    _index_pair,
    _layout,
    _range_args,
    _vector_safe,
    _view3,
    copy_range_numpy,
    gather_rows_numpy,
)

__all__ = [
    "BoundKV", "KVOpsBuildError", "bind", "CudaKVOps", "build", "compact", "copy_range",
    "copy_range_numpy", "cpu_available", "cpu_status", "cuda_built", "cuda_device_count",
    "cuda_library_path", "cuda_ops", "cuda_status", "gather_rows", "gather_rows_numpy",
    "library_path", "move_rows", "reload", "search_dirs", "selftest_cuda", "set_library_dir",
]

# ------------------------------------------------------------------------------- loading --

_lock = threading.Lock()
_loaded: dict[str, tuple[ctypes.CDLL | None, str]] = {}
_override_dir: Path | None = None
_cpu_fns: _CpuFns | None = None  # the loaded CPU kernels (set by _load, cleared by reload)


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


def cuda_device_count() -> int:
    """Number of CUDA devices the CUDA library sees (0 without library, driver or GPU)."""
    lib = _load(CUDA_LIB)[0]
    return 0 if lib is None else _device_count(lib)[0]


# ------------------------------------------------------------------------- CPU dispatch --

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

def cuda_ops(*, emulation: bool = False) -> CudaKVOps:
    """The CUDA kernels (or, with ``emulation=True``, their serial host emulation)."""
    name = CUDA_EMU_LIB if emulation else CUDA_LIB
    lib, msg = _load(name)
    if lib is None:
        raise RuntimeError(f"{name} unavailable: {msg}")
    return CudaKVOps(lib, msg)


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
    return compare_with_reference(
        ops, n_dev, ref_backend, functools.partial(gather_rows, backend=ref_backend),
        functools.partial(copy_range, backend=ref_backend), seed=seed)


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
    out = cmake_build(source_dir, build_dir, cuda=cuda, build_type=build_type, jobs=jobs,
                      timeout=timeout)
    if out.resolve() != DEFAULT_BUILD_DIR.resolve():
        set_library_dir(out)
    else:
        reload()
    return out
