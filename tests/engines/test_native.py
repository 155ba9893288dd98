"""Native KV-cache kernels (engines/kvops) against the numpy reference.

The ``kvops`` session fixture (conftest.py) builds the libraries with cmake (incrementally, into
build/kvops) unless RAPID_KVOPS_DIR points at prebuilt ones; everything native is skipped, with
the reason, when cmake or a C++ compiler is missing. The CUDA path is checked in
test_native_cuda.py.
"""

from __future__ import annotations

import ctypes
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kvops_cases import (
    DTYPES,
    PROPS,
    gather_case,
    random_buf,
    range_buffers,
    range_case,
    same_bytes,
)

from rapid.engines import kvops_abi, kvops_build, native

# ------------------------------------------------------------------------------ helpers --

def naive_gather(buf: np.ndarray, src, dst, axis: int = -2) -> None:
    """The documented semantics, literally: one move after another."""
    v = np.moveaxis(buf, axis, 0)
    for s, d in zip(src, dst, strict=True):
        v[d] = v[s].copy()


@st.composite
def compaction_case(draw):
    dtype = draw(st.sampled_from(DTYPES))
    outer = draw(st.integers(1, 6))
    cap = draw(st.integers(1, 64))
    inner = draw(st.integers(1, 16))
    dst_start = draw(st.integers(0, cap - 1))
    pool = list(range(dst_start, cap))
    src = sorted(draw(st.lists(st.sampled_from(pool), unique=True, max_size=len(pool))))
    return dtype, (outer, cap, inner), src, dst_start, draw(st.integers(0, 2**32 - 1))


# ------------------------------------------------------------------------ numpy reference --

@given(gather_case())
@settings(max_examples=150, deadline=None)
def test_numpy_fallback_matches_naive(case):
    dtype, shape, axis, src, dst, seed = case
    buf = random_buf(np.random.default_rng(seed), shape, dtype)
    want = buf.copy()
    naive_gather(want, src, dst, axis)
    native.gather_rows_numpy(buf, src, dst, axis)
    assert same_bytes(buf, want)


# ------------------------------------------------------------------------ CPU kernels --

@given(case=gather_case())
@PROPS
def test_gather_matches_reference(kvops, case):
    dtype, shape, axis, src, dst, seed = case
    buf = random_buf(np.random.default_rng(seed), shape, dtype)
    want = buf.copy()
    naive_gather(want, src, dst, axis)
    ref = buf.copy()
    native.gather_rows_numpy(ref, np.array(src, np.int64), np.array(dst, np.int64), axis)
    native.gather_rows(buf, src, dst, axis, backend="native")
    assert same_bytes(buf, want)
    assert same_bytes(ref, want)
    bound = random_buf(np.random.default_rng(seed), shape, dtype)
    native.bind(bound, axis, backend="native").gather(src, dst)
    assert same_bytes(bound, want)


@given(case=compaction_case())
@PROPS
def test_inplace_compaction_equals_snapshot(kvops, case):
    dtype, shape, src, dst_start, seed = case
    buf = random_buf(np.random.default_rng(seed), shape, dtype)
    dst = list(range(dst_start, dst_start + len(src)))
    snapshot = buf.copy()
    snapshot[:, dst] = buf[:, src]  # new[dst[i]] = old[src[i]]
    native.gather_rows(buf, src, dst, backend="native")
    assert same_bytes(buf, snapshot)
    again = random_buf(np.random.default_rng(seed), shape, dtype)
    native.compact(again, src, dst_start, backend="native")
    assert same_bytes(again, snapshot)


def test_gather_sequential_semantics(kvops):
    # A right shift reads rows the earlier moves wrote: row 0 propagates.
    buf = np.arange(6, dtype=np.float32).reshape(1, 6, 1).copy()
    native.gather_rows(buf, [0, 1, 2], [1, 2, 3], backend="native")
    assert buf.ravel().tolist() == [0, 0, 0, 0, 4, 5]
    # Repeated destinations: the last move wins.
    buf = np.arange(6, dtype=np.float64).reshape(6, 1).copy()
    native.gather_rows(buf, [4, 5], [0, 0], axis=0, backend="native")
    assert buf.ravel().tolist() == [5, 1, 2, 3, 4, 5]


@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_kv_layout_axis(kvops, dtype):
    # [layers, kv_heads, cap, head_dim] (axis -2) and [layers, cap, kv_heads, head_dim] (axis 1)
    rng = np.random.default_rng(1)
    src, dst = [9, 12, 13, 20], [5, 6, 7, 8]
    for shape, axis in (((3, 2, 24, 8), -2), ((3, 24, 2, 8), 1), ((24, 16), 0), ((4, 24), -1)):
        buf = random_buf(rng, shape, dtype)
        want = buf.copy()
        naive_gather(want, src, dst, axis)
        native.gather_rows(buf, src, dst, axis=axis, backend="native")
        assert same_bytes(buf, want), (shape, axis)


@pytest.mark.parametrize("backend", ["native", "numpy"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_out_of_range_raises_and_leaves_buffer(kvops, backend, dtype):
    rng = np.random.default_rng(2)
    buf = random_buf(rng, (4, 16, 8), dtype)
    before = buf.copy()
    for src, dst in (([1, 2, 16], [0, 1, 2]), ([1, 2], [0, -1]), ([-1], [0]),
                     ([3, 4], [0, 1 << 40])):
        with pytest.raises(ValueError, match="outside"):
            native.gather_rows(buf, src, dst, backend=backend)
        assert same_bytes(buf, before)
        with pytest.raises(ValueError, match="outside"):
            native.bind(buf, backend=backend).gather(src, dst)
        assert same_bytes(buf, before)


@pytest.mark.parametrize("backend", ["native", "numpy"])
def test_bad_arguments(kvops, backend):
    buf = np.zeros((2, 8, 4), np.float32)
    with pytest.raises(ValueError, match="dtype"):
        native.gather_rows(np.zeros((2, 8, 4), np.int32), [1], [0], backend=backend)
    with pytest.raises(ValueError, match="dtype"):
        native.gather_rows(np.zeros((2, 8, 4), np.complex64), [1], [0], backend=backend)
    with pytest.raises(ValueError, match="C-contiguous"):
        native.gather_rows(np.zeros((2, 4, 8), np.float32).transpose(0, 2, 1), [1], [0],
                           backend=backend)
    with pytest.raises(ValueError, match="C-contiguous"):
        native.gather_rows(np.zeros((2, 8, 8), np.float32)[:, :, :4], [1], [0], backend=backend)
    with pytest.raises(ValueError, match="ndim"):
        native.gather_rows(np.zeros(8, np.float32), [1], [0], backend=backend)
    with pytest.raises(ValueError, match="axis"):
        native.gather_rows(buf, [1], [0], axis=3, backend=backend)
    with pytest.raises(ValueError, match="length"):
        native.gather_rows(buf, [1, 2], [0], backend=backend)
    with pytest.raises(ValueError, match="integers"):
        native.gather_rows(buf, [1.0], [0.0], backend=backend)
    with pytest.raises(ValueError, match="1-D"):
        native.gather_rows(buf, [[1]], [[0]], backend=backend)
    ro = np.zeros((2, 8, 4), np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        native.gather_rows(ro, [1], [0], backend=backend)
    with pytest.raises(TypeError):
        native.gather_rows([[0.0]], [0], [0], backend=backend)
    native.gather_rows(buf, [], [], backend=backend)  # empty is a no-op
    native.gather_rows(np.zeros((0, 8, 4), np.float32), [1], [0], backend=backend)


def test_gather_accepts_other_2_byte_types(kvops):
    bits = np.random.default_rng(3).integers(0, 65535, (3, 10, 5), dtype=np.uint16)
    want = bits.copy()
    naive_gather(want, [7, 9], [1, 2])
    native.gather_rows(bits, [7, 9], [1, 2], backend="native")
    assert same_bytes(bits, want)



@given(case=range_case())
@PROPS
def test_copy_range_between_buffers(kvops, case):
    *_, ss, ds, n, _ = case
    src, dst = range_buffers(case)
    src_before = src.copy()
    want = dst.copy()
    want[:, ds:ds + n] = src[:, ss:ss + n]
    ref = dst.copy()
    native.copy_range_numpy(src, ref, ss, ds, n)
    native.copy_range(src, dst, ss, ds, n, backend="native")
    assert same_bytes(dst, want) and same_bytes(ref, want)
    assert same_bytes(src, src_before)


@given(case=range_case())
@PROPS
def test_copy_range_in_place_overlap(kvops, case):
    dtype, outer, inner, cap, _, ss, ds, n, seed = case
    n = min(n, cap - ss)
    ds = min(ds, cap - n)
    buf = random_buf(np.random.default_rng(seed), (outer, cap, inner), dtype)
    want = buf.copy()
    want[:, ds:ds + n] = buf[:, ss:ss + n].copy()
    native.copy_range(buf, buf, ss, ds, n, backend="native")
    assert same_bytes(buf, want)


def test_copy_range_overlapping_views_fall_back(kvops):
    flat = np.arange(2 * 10 * 3 + 3, dtype=np.float32)
    a = flat[:60].reshape(2, 10, 3)
    b = flat[3:63].reshape(2, 10, 3)  # same memory, shifted by one row
    want_flat = flat.copy()
    snapshot = want_flat[:60].reshape(2, 10, 3).copy()
    want_flat[3:63].reshape(2, 10, 3)[:, 4:9] = snapshot[:, 1:6]
    native.copy_range(a, b, 1, 4, 5, backend="native")
    assert same_bytes(flat, want_flat)


@pytest.mark.parametrize("backend", ["native", "numpy"])
def test_copy_range_errors(kvops, backend):
    a = np.zeros((2, 8, 4), np.float32)
    with pytest.raises(ValueError, match="outside"):
        native.copy_range(a, a, 5, 0, 4, backend=backend)
    with pytest.raises(ValueError, match="outside"):
        native.copy_range(a, a, 0, -1, 2, backend=backend)
    with pytest.raises(ValueError, match="length"):
        native.copy_range(a, a, 0, 0, -1, backend=backend)
    with pytest.raises(ValueError, match="dtype"):
        native.copy_range(a, np.zeros((2, 8, 4), np.float64), 0, 0, 1, backend=backend)
    with pytest.raises(ValueError, match="outside the sequence axis"):
        native.copy_range(a, np.zeros((2, 8, 5), np.float32), 0, 0, 1, backend=backend)
    with pytest.raises(ValueError, match="outside the sequence axis"):
        native.copy_range(a, np.zeros((3, 8, 4), np.float32), 0, 0, 1, backend=backend)


@given(case=gather_case(max_n=20))
@PROPS
def test_move_rows_snapshot(kvops, case):
    dtype, shape, axis, src, dst, seed = case
    dst = list(dict.fromkeys(dst))  # unique destinations
    src = src[:len(dst)]
    buf = random_buf(np.random.default_rng(seed), shape, dtype)
    v = np.moveaxis(buf.copy(), axis, 0)
    want = v.copy()
    want[dst] = v[src]
    native.move_rows(buf, src, dst, axis, backend="native")
    assert same_bytes(np.moveaxis(buf, axis, 0), want)


def test_move_rows_rejects_repeated_dst(kvops):
    with pytest.raises(ValueError, match="repeated"):
        native.move_rows(np.zeros((1, 4, 1), np.float32), [1, 2], [0, 0])


def test_c_abi_error_codes(kvops):
    lib = native._load(native.CPU_LIB)[0]
    buf = np.arange(24, dtype=np.float32).reshape(2, 6, 2).copy()
    before = buf.copy()
    p = buf.ctypes.data
    idx = np.array([1, 2, 6], np.int64)
    ok = np.array([0, 1, 2], np.int64)
    assert lib.rapid_kvops_abi_version() == native.ABI_VERSION
    assert lib.rapid_kv_gather_f32(p, 2, 6, 2, idx.ctypes.data, ok.ctypes.data, 3) == native.ERR_INDEX
    assert lib.rapid_kv_gather_f32(p, 2, 6, 2, ok.ctypes.data, idx.ctypes.data, 3) == native.ERR_INDEX
    assert lib.rapid_kv_gather_f32(p, 2, 6, 2, ok.ctypes.data, ok.ctypes.data, -1) == kvops_abi.ERR_ARG
    assert lib.rapid_kv_gather_f32(p, 2, 6, 2, None, ok.ctypes.data, 3) == kvops_abi.ERR_ARG
    assert lib.rapid_kv_gather_f32(None, 2, 6, 2, ok.ctypes.data, ok.ctypes.data, 3) == kvops_abi.ERR_ARG
    assert lib.rapid_kv_gather_f32(p, -2, 6, 2, ok.ctypes.data, ok.ctypes.data, 3) == kvops_abi.ERR_ARG
    assert lib.rapid_kv_gather_f32(p, 1 << 40, 1 << 20, 1 << 20, ok.ctypes.data,
                                   ok.ctypes.data, 3) == kvops_abi.ERR_ARG  # size overflow
    assert lib.rapid_kv_gather_f32(p, 2, 6, 2, None, None, 0) == kvops_abi.OK
    assert lib.rapid_kv_copy_range_f32(p, p, 2, 6, 6, 2, 4, 0, 3) == native.ERR_INDEX
    assert lib.rapid_kv_copy_range_f32(p, p + 8, 2, 6, 6, 2, 0, 1, 3) == native.ERR_OVERLAP
    assert lib.rapid_kv_copy_range_f32(p, None, 2, 6, 6, 2, 0, 1, 3) == kvops_abi.ERR_ARG
    assert same_bytes(buf, before)


def test_fallback_when_library_missing(kvops, monkeypatch):
    monkeypatch.setattr(native, "_load", lambda name: (None, f"{name} missing (test)"))
    monkeypatch.setattr(native, "_cpu_fns", None)
    assert not native.cpu_available() and not native.cuda_built()
    assert "missing" in native.cpu_status() and "missing" in native.cuda_status()
    buf = np.arange(12, dtype=np.float32).reshape(1, 6, 2).copy()
    want = buf.copy()
    naive_gather(want, [4, 5], [0, 1])
    native.gather_rows(buf, [4, 5], [0, 1])  # auto -> numpy
    assert same_bytes(buf, want)
    native.copy_range(buf, buf, 0, 2, 2)
    with pytest.raises(RuntimeError, match="unavailable"):
        native.gather_rows(buf, [4], [0], backend="native")
    assert native.selftest_cuda().startswith("skipped:")


def test_library_search_order(kvops, tmp_path, monkeypatch):
    lib = native.library_path()
    assert lib is not None and lib.is_file()
    shutil.copy2(lib, tmp_path / lib.name)
    monkeypatch.setenv("RAPID_KVOPS_DIR", str(tmp_path))
    try:
        native.reload()
        dirs = native.search_dirs()
        assert dirs.index(tmp_path) < dirs.index(native.DEFAULT_BUILD_DIR)
        if native._override_dir is None:
            assert native.library_path() == tmp_path / lib.name
            assert native.cpu_available() and str(tmp_path) in native.cpu_status()
    finally:
        monkeypatch.delenv("RAPID_KVOPS_DIR")
        native.reload()
    assert native.cpu_available()


def test_build_without_cmake(monkeypatch, tmp_path):
    monkeypatch.setattr(kvops_build.shutil, "which", lambda name: None)
    with pytest.raises(native.KVOpsBuildError, match="cmake not found"):
        native.build(build_dir=tmp_path)



def test_ctypes_signatures_are_bound(kvops):
    lib = native._load(native.CPU_LIB)[0]
    assert lib.rapid_kv_gather_f16.argtypes[0] is ctypes.c_void_p
    assert lib.rapid_kv_copy_range_f64.restype is ctypes.c_int
