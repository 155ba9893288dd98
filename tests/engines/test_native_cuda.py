"""The CUDA path of the native KV-cache kernels (engines/kvops), checked three ways.

The library compiled (when nvcc exists), the CPU emulation library runs the CUDA planner and
kernel bodies against the CPU kernels (always), and the real kernels run on a GPU (only where
there is one). The ``kvops`` session fixture (conftest.py) builds the libraries.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from kvops_cases import PROPS, gather_case, random_buf, range_buffers, range_case, same_bytes

from rapid.engines import native


def _nvcc() -> str | None:
    for c in (os.environ.get("CUDACXX"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return c
    return None


@pytest.fixture(scope="session")
def emu(kvops):
    try:
        return native.cuda_ops(emulation=True)
    except RuntimeError as e:
        pytest.skip(f"CUDA emulation library not built: {e}")


def test_cuda_library_compiled(kvops):
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found: the CUDA library is not built here")
    path = kvops / native._lib_filename(native.CUDA_LIB)
    if os.environ.get("RAPID_KVOPS_DIR") and not path.is_file():
        pytest.skip(f"prebuilt RAPID_KVOPS_DIR has no CUDA library ({path})")
    assert path.is_file(), f"nvcc ({nvcc}) exists but {path} was not built"
    # Loading needs only cudart; a missing driver shows up in the status, not as a failure.
    status = native.cuda_status()
    assert native.cuda_built(), status


def test_cuda_emulation_selftest(emu):
    assert emu.emulation
    msg = native.selftest_cuda(emulation=True)
    assert msg.startswith("ok:"), msg


@given(case=gather_case(max_n=60))
@PROPS
def test_cuda_emulation_gather_matches_cpu(emu, case):
    dtype, shape, axis, src, dst, seed = case
    buf = random_buf(np.random.default_rng(seed), shape, dtype)
    want = buf.copy()
    native.gather_rows(want, src, dst, axis, backend="native")
    outer, cap, inner = native._layout(buf, axis)
    emu.gather(buf.ctypes.data, outer, cap, inner, dtype, src, dst)
    assert same_bytes(buf, want)


@given(case=range_case())
@PROPS
def test_cuda_emulation_copy_range_matches_cpu(emu, case):
    dtype, outer, inner, scap, dcap, ss, ds, n, _ = case
    src, dst = range_buffers(case)
    want = dst.copy()
    native.copy_range(src, want, ss, ds, n, backend="native")
    emu.copy_range(src.ctypes.data, dst.ctypes.data, outer, scap, dcap, inner, dtype, ss, ds, n)
    assert same_bytes(dst, want)
    # in place, overlapping
    m = min(n, scap - ss)
    d2 = min(ds, scap - m)
    want = src.copy()
    native.copy_range(want, want, ss, d2, m, backend="native")
    emu.copy_range(src.ctypes.data, src.ctypes.data, outer, scap, scap, inner, dtype, ss, d2, m)
    assert same_bytes(src, want)


def test_cuda_emulation_errors(emu):
    buf = np.zeros((2, 6, 2), np.float32)
    before = buf.copy()
    with pytest.raises(ValueError, match="index out of range"):
        emu.gather(buf.ctypes.data, 2, 6, 2, np.float32, [0, 6], [1, 2])
    with pytest.raises(ValueError, match="index out of range"):
        emu.copy_range(buf.ctypes.data, buf.ctypes.data, 2, 6, 6, 2, np.float32, 4, 0, 3)
    assert same_bytes(buf, before)
    with pytest.raises(ValueError, match="dtype"):
        emu.gather(buf.ctypes.data, 2, 6, 2, np.int8, [0], [1])


@pytest.mark.gpu
def test_cuda_kernels_on_gpu(kvops):
    if not native.cuda_built():
        pytest.skip(f"CUDA library not available: {native.cuda_status()}")
    if native.cuda_device_count() == 0:
        pytest.skip(f"no CUDA driver/GPU ({native.cuda_status()})")
    msg = native.selftest_cuda()
    assert msg.startswith("ok:"), msg
