"""Argument checks and numpy reference implementations of the KV-cache moves.

Owns the validation every backend shares — supported dtypes (:func:`_itemsize_of`), the
zero-copy ``[outer, seq_cap, inner]`` view of a buffer (:func:`_layout`, :func:`_view3`), index
arrays (:func:`_as_index`, :func:`_index_pair`, :func:`_check_indices`) and range arguments
(:func:`_range_args`) — and the numpy fallbacks :func:`gather_rows_numpy` and
:func:`copy_range_numpy`, which have exactly the native kernels' semantics and errors.
The public entry points are in :mod:`rapid.engines.native`.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import numpy as np

from rapid.engines.kvops_abi import _SUFFIX

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
