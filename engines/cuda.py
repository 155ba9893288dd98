"""The only module that touches pycuda: context, device/pinned memory, stream, events, copies.

Everything is imported lazily; :func:`require_pycuda` raises a :class:`CudaUnavailableError`
(a ``RapidError``) that says how to get pycuda, so ``import rapid.engines.cuda`` always works.

The context is device N's *primary* context — the one the CUDA runtime (TensorRT, the native
``librapid_kvops_cuda`` kernels) uses — so pointers and streams are shared freely. Methods of
an engine should run inside ``with ctx:`` (push/pop), which makes them callable from any thread.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from rapid.core.errors import RapidError

PYCUDA_HINT = (
    "`pip install pycuda` (on a Jetson it builds against JetPack's CUDA: first "
    "`export PATH=/usr/local/cuda/bin:$PATH CUDA_ROOT=/usr/local/cuda` so nvcc and cuda.h are found)")


class CudaUnavailableError(RapidError):
    """pycuda is missing or no CUDA device/driver can be used."""


_drv: Any = None
_init_lock = threading.Lock()


def require_pycuda() -> Any:
    """``pycuda.driver``, initialised; raises :class:`CudaUnavailableError` with a how-to."""
    global _drv
    if _drv is not None:
        return _drv
    with _init_lock:
        if _drv is None:
            try:
                import pycuda.driver as drv
            except ImportError as e:
                raise CudaUnavailableError(f"the TensorRT backend needs pycuda, which is not installed: {PYCUDA_HINT}") from e
            try:
                drv.init()
                if drv.Device.count() < 1:
                    raise CudaUnavailableError("pycuda found no CUDA device")
            except drv.Error as e:
                raise CudaUnavailableError(f"CUDA driver initialisation failed: {e}") from e
            _drv = drv
    return _drv


class CudaContext:
    """Retains device ``ordinal``'s primary context; ``with ctx:`` makes it current."""

    def __init__(self, ordinal: int = 0) -> None:
        drv = require_pycuda()
        if not 0 <= ordinal < drv.Device.count():
            raise CudaUnavailableError(f"no CUDA device {ordinal} (found {drv.Device.count()})")
        self.device = drv.Device(ordinal)
        self.ordinal = ordinal
        self.name = self.device.name()
        self._ctx = self.device.retain_primary_context()

    def __enter__(self) -> CudaContext:
        self._ctx.push()
        return self

    def __exit__(self, *exc: object) -> None:
        require_pycuda().Context.pop()

    def close(self) -> None:
        if self._ctx is not None:
            self._ctx.detach()
            self._ctx = None


class DeviceBuffer:
    """``nbytes`` of device memory (at least 256, so even an empty tensor has a valid address)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = int(nbytes)
        self._alloc = require_pycuda().mem_alloc(max(self.nbytes, 256))
        self.ptr = int(self._alloc)

    def free(self) -> None:
        if self._alloc is not None:
            self._alloc.free()
            self._alloc = None
            self.ptr = 0


def pinned_empty(shape: int | tuple[int, ...], dtype: Any) -> np.ndarray:
    """Page-locked host memory (needed for truly asynchronous copies)."""
    return require_pycuda().pagelocked_empty(shape, dtype)


class Stream:
    def __init__(self) -> None:
        self._s = require_pycuda().Stream()

    @property
    def handle(self) -> int:
        """The ``cudaStream_t`` as an int (for TensorRT and ctypes kernels)."""
        return int(self._s.handle)

    @property
    def raw(self) -> Any:
        return self._s

    def synchronize(self) -> None:
        self._s.synchronize()


class Event:
    """A CUDA event: ``record(stream)`` after enqueueing, ``query()`` never blocks."""

    def __init__(self) -> None:
        drv = require_pycuda()
        self._e = drv.Event(drv.event_flags.DISABLE_TIMING)
        self._recorded = False

    def record(self, stream: Stream) -> None:
        self._e.record(stream.raw)
        self._recorded = True

    def query(self) -> bool:
        return (not self._recorded) or bool(self._e.query())

    def synchronize(self) -> None:
        if self._recorded:
            self._e.synchronize()


def htod_async(dst_ptr: int, host: np.ndarray, stream: Stream) -> None:
    if host.nbytes:
        require_pycuda().memcpy_htod_async(dst_ptr, host, stream.raw)


def dtoh_async(host: np.ndarray, src_ptr: int, stream: Stream) -> None:
    if host.nbytes:
        require_pycuda().memcpy_dtoh_async(host, src_ptr, stream.raw)


class DeviceCopyError(RapidError):
    """A device copy CUDA would reject (rows wider than a pitch) or leave undefined (overlap)."""


class OverlappingCopyError(DeviceCopyError):
    """A device copy whose source and destination bytes overlap."""


def _row_starts(base: int, pitch: int, slice_height: int, height: int, depth: int) -> np.ndarray:
    """Start address of every row of a [depth, height] region (rows ``slice_height`` per slice)."""
    y = np.arange(height, dtype=np.int64) * pitch
    z = np.arange(depth, dtype=np.int64) * (pitch * slice_height)
    return (base + z[:, None] + y[None, :]).ravel()


def regions_overlap(dst: int, dst_pitch: int, dst_height: int, src: int, src_pitch: int, src_height: int,
                    width: int, height: int, depth: int = 1) -> bool:
    """Whether two strided regions of ``depth × height`` rows of ``width`` bytes share a byte.

    Row (z, y) of a region starts at ``base + z·pitch·slice_height + y·pitch``. Two rows
    ``[a, a+w)`` and ``[d, d+w)`` intersect iff ``|a − d| < w``: sort one side's starts and look
    each of the other side's up (O(n log n) in the rows; O(1) when the bounding spans are apart).
    """
    if width == 0 or height == 0 or depth == 0:
        return False
    dst_end = dst + (depth - 1) * dst_pitch * dst_height + (height - 1) * dst_pitch + width
    src_end = src + (depth - 1) * src_pitch * src_height + (height - 1) * src_pitch + width
    if dst_end <= src or src_end <= dst:
        return False
    a = np.sort(_row_starts(src, src_pitch, src_height, height, depth))
    d = _row_starts(dst, dst_pitch, dst_height, height, depth)
    i = np.searchsorted(a, d - width + 1)
    hit = i < len(a)
    return bool(np.any(a[np.minimum(i, len(a) - 1)][hit] < d[hit] + width))


def _check_copy(dst: int, dst_pitch: int, dst_height: int, src: int, src_pitch: int, src_height: int,
                width: int, height: int, depth: int) -> bool:
    """False for a no-op (nothing, or every byte onto itself); raises on a partial overlap."""
    if width == 0 or height == 0 or depth == 0:
        return False
    if (dst, dst_pitch) == (src, src_pitch) and (depth == 1 or dst_height == src_height):
        return False
    if width > min(src_pitch, dst_pitch) or (depth > 1 and height > min(src_height, dst_height)):
        raise DeviceCopyError(f"copy of {depth}x{height} rows of {width} B does not fit pitches "
                         f"{src_pitch}/{dst_pitch}, slice heights {src_height}/{dst_height}")
    if regions_overlap(dst, dst_pitch, dst_height, src, src_pitch, src_height, width, height, depth):
        raise OverlappingCopyError(f"device copy {src:#x} -> {dst:#x} ({depth}x{height} rows of {width} B) "
                                   "overlaps itself")
    return True


def copy_2d_async(dst_ptr: int, dst_pitch: int, src_ptr: int, src_pitch: int, width: int, height: int,
                  stream: Stream) -> None:
    """Device→device: ``height`` rows of ``width`` bytes, with the given row pitches (bytes).

    Strided KV moves are one such copy: rows = (layer, head) pairs, pitch = capacity × head_dim ×
    itemsize. A copy of every byte onto itself is skipped; any other overlap raises
    :class:`OverlappingCopyError` (CUDA leaves overlapping copies undefined).
    """
    if not _check_copy(dst_ptr, dst_pitch, height, src_ptr, src_pitch, height, width, height, 1):
        return
    drv = require_pycuda()
    c = drv.Memcpy2D()
    c.set_src_device(src_ptr)
    c.set_dst_device(dst_ptr)
    c.src_pitch = src_pitch
    c.dst_pitch = dst_pitch
    c.width_in_bytes = width
    c.height = height
    c(stream.raw)


def copy_3d_async(dst_ptr: int, dst_pitch: int, dst_height: int, src_ptr: int, src_pitch: int,
                  src_height: int, width: int, height: int, depth: int, stream: Stream) -> None:
    """Device→device: ``depth`` slices of ``height`` rows of ``width`` bytes.

    Row y of slice z is at ``ptr + z·pitch·slice_height + y·pitch`` on either side, so one call
    moves every layer's (kv_heads × entries) block between the cache (slice height kv_heads) and
    a padded per-layer block buffer (see ``rapid.engines.trt_layout``). Same overlap rule as
    :func:`copy_2d_async`.
    """
    if not _check_copy(dst_ptr, dst_pitch, dst_height, src_ptr, src_pitch, src_height, width, height, depth):
        return
    drv = require_pycuda()
    c = drv.Memcpy3D()
    c.set_src_device(src_ptr)
    c.set_dst_device(dst_ptr)
    c.src_pitch, c.src_height = src_pitch, src_height
    c.dst_pitch, c.dst_height = dst_pitch, dst_height
    c.width_in_bytes, c.height, c.depth = width, height, depth
    c(stream.raw)
