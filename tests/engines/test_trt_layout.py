"""The TensorRT backend's pure pieces: aligned per-layer blocks, the memory plan (the numbers in
docs/engines.md), and the device-copy guard (no copy of overlapping bytes) over the fake pycuda."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from trt_emulation import DeviceMemory, _fake_pycuda

from rapid.engines import cuda
from rapid.engines.trt_layout import ALIGN, block_layout, blocks_bytes, plan

SHAPES = [(2, 16, 4), (2, 16, 2), (2, 64, 2), (1, 64, 2), (4, 128, 2), (8, 128, 4), (1, 80, 2), (3, 96, 2)]


@pytest.mark.parametrize("kvh,hd,item", SHAPES)
def test_blocks_are_aligned_contiguous_and_tight(kvh, hd, item):
    for n in range(0, 300):
        b = block_layout(n, kvh, hd, item)
        assert b.stride % ALIGN == 0 and b.pitch == n * hd * item
        assert b.height >= kvh  # the tensor [kvh, n, hd] fits, packed, at the block's start
        q = ALIGN // np.gcd(ALIGN, b.pitch) if b.pitch else 1
        assert b.height % q == 0 and b.height < kvh + q  # the fewest rows that keep the alignment
        assert all(b.offset(i) % ALIGN == 0 for i in range(24))


def test_default_draft_blocks_need_no_padding():
    """Qwen2.5-Coder-0.5B in fp16: pitch = 128·n, so kv_heads = 2 rows are always a multiple of 256 B."""
    assert all(block_layout(n, 2, 64, 2).height == 2 for n in range(1, 2049))
    assert blocks_bytes(2048, 24, 2, 64, 2) == 24 * 2 * 2048 * 64 * 2


def test_memory_plan_of_the_default_draft():
    """docs/engines.md, worked through: 24 layers, 2 KV heads, head dim 64, vocab 151936, fp16,
    capacity 2048, chunk 256 (the prefill profile's max T), rows_cap 64 (max_tree)."""
    p = plan(24, 2, 64, 151936, 2048, 256, 64, 2)
    assert p.kv == 24 * 2 * 2048 * 64 * 2 == 12_582_912  # 12 MiB each for K and V
    assert p.stage == 12_582_912 and p.present == 24 * 2 * 256 * 64 * 2 == 1_572_864
    assert p.mask == 256 * 2048 * 2 and p.logits == 256 * 151936 * 2 == 77_791_232
    assert p.device == 132_321_280  # 126.2 MiB
    assert p.pinned == 2 * (2 * 256 * 8 + 256 * 2048 * 2 + 64 * 151936 * 2) == 41_000_960  # 39.1 MiB
    old = plan(24, 2, 64, 151936, 2048, 512, 512, 2)  # the previous defaults: chunk 512, all rows pinned
    assert old.device + old.pinned > 3 * (p.device + p.pinned)


def _bytes(base, pitch, slice_height, w, h, d) -> set[int]:
    return {base + z * pitch * slice_height + y * pitch + k for z in range(d) for y in range(h) for k in range(w)}


def _brute(dst, dp, dh, src, sp, sh, w, h, d) -> bool:
    return bool(_bytes(dst, dp, dh, w, h, d) & _bytes(src, sp, sh, w, h, d))


def test_regions_overlap_agrees_with_brute_force():
    rng = np.random.default_rng(0)
    for _ in range(400):
        w, h, d = (int(x) for x in rng.integers(1, 5, 3))
        sp, dp = (int(x) for x in rng.integers(w, w + 6, 2))
        sh, dh = (int(x) for x in rng.integers(h, h + 3, 2))
        src, dst = (int(x) for x in rng.integers(0, 60, 2))
        assert cuda.regions_overlap(dst, dp, dh, src, sp, sh, w, h, d) == _brute(dst, dp, dh, src, sp, sh, w, h, d)


@pytest.fixture
def fake_cuda(monkeypatch):
    mem = DeviceMemory()
    pkg = _fake_pycuda(mem)
    calls = []

    class Counting(pkg.driver.Memcpy3D):
        def __call__(self, stream=None):
            calls.append(self.depth)
            return super().__call__(stream)

    pkg.driver.Memcpy2D = pkg.driver.Memcpy3D = Counting
    monkeypatch.setitem(sys.modules, "pycuda", pkg)
    monkeypatch.setitem(sys.modules, "pycuda.driver", pkg.driver)
    monkeypatch.setattr(cuda, "_drv", None)
    return mem, calls


def test_copies_onto_themselves_are_skipped_and_overlaps_refused(fake_cuda):
    mem, calls = fake_cuda
    buf, s = cuda.DeviceBuffer(1024), cuda.Stream()
    cuda.copy_2d_async(buf.ptr, 256, buf.ptr, 256, 64, 4, s)  # every byte onto itself: nothing issued
    cuda.copy_3d_async(buf.ptr, 64, 2, buf.ptr, 64, 2, 64, 2, 4, s)
    assert calls == []
    cuda.copy_2d_async(buf.ptr + 64, 256, buf.ptr, 256, 64, 4, s)  # next slot over: disjoint rows
    assert calls == [1]
    with pytest.raises(cuda.OverlappingCopyError):
        cuda.copy_2d_async(buf.ptr + 32, 256, buf.ptr, 256, 64, 4, s)
    with pytest.raises(cuda.OverlappingCopyError):  # row 1 of the source is row 0 of the destination
        cuda.copy_2d_async(buf.ptr + 256, 256, buf.ptr, 256, 64, 2, s)
    with pytest.raises(cuda.DeviceCopyError):
        cuda.copy_2d_async(buf.ptr + 512, 32, buf.ptr, 256, 64, 2, s)  # rows wider than the pitch
    assert calls == [1]


def test_a_3d_copy_packs_every_layer_into_its_aligned_block(fake_cuda):
    """cache [L·kvh, C, hd] slots [0, n) -> blocks of trt_layout, one call, as the engine stages."""
    layers, kvh, cap, hd, n = 3, 2, 8, 16, 5
    cache = np.arange(layers * kvh * cap * hd, dtype=np.float32).reshape(layers, kvh, cap, hd)
    b = block_layout(n, kvh, hd, 4)
    s = cuda.Stream()
    src, dst = cuda.DeviceBuffer(cache.nbytes), cuda.DeviceBuffer(layers * b.stride)
    cuda.htod_async(src.ptr, cache, s)
    cuda.copy_3d_async(dst.ptr, b.pitch, b.height, src.ptr, cap * hd * 4, kvh, b.pitch, kvh, layers, s)
    host = np.empty(layers * b.stride // 4, np.float32)
    cuda.dtoh_async(host, dst.ptr, s)
    for i in range(layers):
        got = host[b.offset(i) // 4:b.offset(i) // 4 + kvh * n * hd].reshape(kvh, n, hd)
        np.testing.assert_array_equal(got, cache[i, :, :n])
