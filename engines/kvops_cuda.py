"""The CUDA KV kernels through ctypes: :class:`CudaKVOps` and the GPU-vs-CPU self-test body.

Owns the wrapper around a loaded ``librapid_kvops_cuda`` (or its host emulation,
``librapid_kvops_cuda_emu``) — device pointers, host index arrays, malloc/memcpy/free helpers,
CUDA error reporting — and :func:`compare_with_reference`, the case list and comparison run by
:func:`rapid.engines.native.selftest_cuda`. Finding and loading the library, and choosing the
CPU reference, stay in :mod:`rapid.engines.native`.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from rapid.engines.kvops_abi import _SUFFIX, CUDA_CHUNK, ERR_CUDA, _device_count, _raise_rc
from rapid.engines.kvops_numpy import _index_pair, _itemsize_of


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


class _Checker:
    """Runs one case on the device and compares its bytes with the CPU's expectation."""

    def __init__(self, ops: CudaKVOps) -> None:
        self.ops, self.checked, self.failures = ops, 0, []

    def run(self, label: str, host: np.ndarray, expect: np.ndarray, launch) -> None:
        ops = self.ops
        ptr = ops.malloc(host.nbytes)
        try:
            ops.upload(ptr, host)
            launch(ptr)
            ops.synchronize()
            got = ops.download(ptr, host)
        finally:
            ops.free(ptr)
        self.checked += 1
        if not np.array_equal(got.view(np.uint8), expect.view(np.uint8)):
            self.failures.append(label)


def compare_with_reference(ops: CudaKVOps, n_dev: int, ref_backend: str,
                           gather_ref: Callable[..., None], copy_ref: Callable[..., None],
                           *, seed: int = 0) -> str:
    """Run every self-test case on ``ops`` and compare bytes with the CPU reference.

    ``gather_ref(buf, src, dst)`` and ``copy_ref(src_buf, dst_buf, src_start, dst_start, n)``
    are the CPU kernels of backend ``ref_backend`` (named in the messages). Returns
    ``"ok: ..."``; raises RuntimeError on a mismatch.
    """
    rng = np.random.default_rng(seed)
    check = _Checker(ops)
    for k, (dt, shape, src, dst) in enumerate(_selftest_cases(rng)):
        host = rng.standard_normal(shape).astype(dt)
        expect = host.copy()
        gather_ref(expect, src, dst)
        check.run(f"gather#{k} {np.dtype(dt).name} {shape} n={len(src)}", host, expect,
                  lambda p, sh=shape, d=dt, s=src, t=dst: ops.gather(p, *sh, d, s, t))
    for dt in (np.float16, np.float32, np.float64):
        _copy_range_cases(check, rng, np.dtype(dt), copy_ref)
    kind = "emulated device" if ops.emulation else f"{n_dev} CUDA device(s)"
    if check.failures:
        raise RuntimeError(f"CUDA KV kernels disagree with the CPU reference ({ref_backend}) in "
                           f"{len(check.failures)}/{check.checked} cases: {check.failures[:8]}")
    return f"ok: {check.checked} cases match the {ref_backend} reference on {kind}"


def _copy_range_cases(check: _Checker, rng: np.random.Generator, dt: np.dtype,
                      copy_ref: Callable[..., None]) -> None:
    """copy_range in place (overlapping both ways) and between buffers of different capacity."""
    ops, outer, cap, inner = check.ops, 6, 128, 24
    for ss, ds, n in ((40, 10, 50), (10, 40, 50), (0, 64, 64), (5, 5, 30), (100, 0, 28)):
        host = rng.standard_normal((outer, cap, inner)).astype(dt)
        expect = host.copy()
        copy_ref(expect, expect, ss, ds, n)
        check.run(f"copy_range in-place {dt.name} {ss}->{ds} n={n}", host, expect,
                  lambda p, a=ss, b=ds, m=n: ops.copy_range(p, p, outer, cap, cap, inner, dt, a, b, m))
    # between two buffers of different capacity (boundary save / restore)
    small = np.zeros((outer, 32, inner), dt)
    host = rng.standard_normal((outer, cap, inner)).astype(dt)
    expect = small.copy()
    copy_ref(host, expect, 70, 3, 20)
    src_ptr = ops.malloc(host.nbytes)
    try:
        ops.upload(src_ptr, host)
        check.run(f"copy_range between buffers {dt.name}", small, expect,
                  lambda p: ops.copy_range(src_ptr, p, outer, cap, 32, inner, dt, 70, 3, 20))
    finally:
        ops.free(src_ptr)
