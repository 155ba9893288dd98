"""rapid.kvcache.StaticKV: begin/attend/commit, truncate, compact (overlapping moves)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rapid.core.errors import ContextFullError, RapidError
from rapid.kvcache import StaticKV

L, H, D = 2, 2, 3


def new_entries(t: int, base: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct, recognisable k/v entries [1, H, t, D]."""
    k = base + torch.arange(H * t * D, dtype=torch.float32).view(1, H, t, D)
    return k, -k


def filled(length: int, capacity: int) -> StaticKV:
    """A cache whose entry at slot s, layer l, head h, dim d is a unique number."""
    kv = StaticKV(L, H, D, capacity)
    vals = torch.arange(L * H * capacity * D, dtype=torch.float32).view(L, H, capacity, D) + 1.0
    kv.k[:, :, :length] = vals[:, :, :length]
    kv.v[:, :, :length] = -vals[:, :, :length]
    kv.length = length
    return kv


def test_begin_attend_commit():
    kv = StaticKV(L, H, D, capacity=8)
    assert kv.length == 0 and kv.k.shape == (L, H, 8, D)
    kv.begin(3)
    outs = []
    for layer in range(L):
        k, v = new_entries(3, 100.0 * layer)
        ka, va = kv.attend_kv(layer, k, v)
        assert ka.shape == (1, H, 3, D) and va.shape == (1, H, 3, D)
        torch.testing.assert_close(ka, k)
        torch.testing.assert_close(va, v)
        outs.append(k)
    assert kv.length == 0  # nothing is committed before commit()
    kv.commit(3)
    assert kv.length == 3

    kv.begin(2)
    k2, v2 = new_entries(2, 1000.0)
    ka, va = kv.attend_kv(1, k2, v2)
    assert ka.shape == (1, H, 5, D)
    torch.testing.assert_close(ka[:, :, :3], outs[1])  # old entries of that layer
    torch.testing.assert_close(ka[:, :, 3:], k2)
    torch.testing.assert_close(va[:, :, 3:], v2)
    # layer 0 untouched by the layer-1 write
    torch.testing.assert_close(kv.k[0, :, :3][None], outs[0])
    kv.commit(2)
    assert kv.length == 5


def test_forward_without_commit_leaves_length():
    kv = StaticKV(L, H, D, capacity=6)
    kv.begin(2)
    kv.attend_kv(0, *new_entries(2, 0.0))
    assert kv.length == 0  # a failed forward (no commit) is not half-applied
    kv.begin(4)
    k, v = new_entries(4, 7.0)
    ka, _ = kv.attend_kv(0, k, v)
    assert ka.shape[2] == 4
    kv.commit(4)
    assert kv.length == 4


def test_attend_requires_matching_begin():
    kv = StaticKV(L, H, D, capacity=6)
    with pytest.raises(RuntimeError):
        kv.attend_kv(0, *new_entries(1, 0.0))  # no begin
    kv.begin(2)
    with pytest.raises(RuntimeError):
        kv.attend_kv(0, *new_entries(3, 0.0))
    kv.commit(2)
    with pytest.raises(RuntimeError):
        kv.attend_kv(0, *new_entries(2, 0.0))  # commit clears the reservation


def test_context_full():
    kv = StaticKV(L, H, D, capacity=4)
    kv.begin(4)  # exactly full is fine
    kv.commit(4)
    with pytest.raises(ContextFullError):
        kv.begin(1)
    kv.truncate(1)
    with pytest.raises(ContextFullError) as e:
        kv.begin(4)
    assert isinstance(e.value, RapidError)
    assert kv.length == 1
    kv.begin(3)


def test_truncate_bounds():
    kv = filled(5, 8)
    for bad in (-1, 6, 9):
        with pytest.raises(ValueError):
            kv.truncate(bad)
        assert kv.length == 5
    kv.truncate(5)
    assert kv.length == 5
    kv.truncate(2)
    assert kv.length == 2
    with pytest.raises(ValueError):
        kv.truncate(3)  # cannot grow back
    kv.truncate(0)
    assert kv.length == 0


def test_for_config():
    class C:
        num_layers, num_kv_heads, head_dim = 3, 2, 4

    kv = StaticKV.for_config(C, 16, torch.float64)
    assert kv.k.shape == (3, 2, 16, 4) and kv.v.dtype == torch.float64 and kv.capacity == 16


@settings(max_examples=150, deadline=None)
@given(data=st.data(), length=st.integers(1, 12), extra=st.integers(0, 6))
def test_compact_matches_numpy_reference(data, length, extra):
    capacity = length + extra
    src = data.draw(st.lists(st.integers(0, length - 1), max_size=length))
    dst = data.draw(st.integers(0, min(length, capacity - len(src))))
    kv = filled(length, capacity)
    k0, v0 = kv.k.numpy().copy(), kv.v.numpy().copy()

    kv.compact(src, dst)

    n = len(src)
    assert kv.length == dst + n
    # reference: gather every source first, then write (moves may overlap)
    ref_k, ref_v = k0.copy(), v0.copy()
    gathered = [(k0[:, :, s].copy(), v0[:, :, s].copy()) for s in src]
    for i, (gk, gv) in enumerate(gathered):
        ref_k[:, :, dst + i] = gk
        ref_v[:, :, dst + i] = gv
    np.testing.assert_array_equal(kv.k.numpy()[:, :, :dst + n], ref_k[:, :, :dst + n])
    np.testing.assert_array_equal(kv.v.numpy()[:, :, :dst + n], ref_v[:, :, :dst + n])
    # entries before dst_start are untouched
    np.testing.assert_array_equal(kv.k.numpy()[:, :, :dst], k0[:, :, :dst])
    np.testing.assert_array_equal(kv.v.numpy()[:, :, :dst], v0[:, :, :dst])


def test_compact_accepted_path_example():
    kv = filled(10, 12)
    before = kv.k.clone()
    kv.compact([6, 8, 9], 5)  # prefix 0..4, root at 5 dropped, path slots 6, 8, 9 kept
    assert kv.length == 8
    torch.testing.assert_close(kv.k[:, :, :5], before[:, :, :5])
    torch.testing.assert_close(kv.k[:, :, 5:8], before[:, :, [6, 8, 9]])
    # a move onto itself and an empty move are no-ops apart from length
    kv.compact([5, 6, 7], 5)
    assert kv.length == 8
    torch.testing.assert_close(kv.k[:, :, 5:8], before[:, :, [6, 8, 9]])
    kv.compact([], 3)
    assert kv.length == 3


def test_compact_backward_overlap():
    kv = filled(6, 6)
    before = kv.v.clone()
    kv.compact([1, 2, 3, 4], 0)
    torch.testing.assert_close(kv.v[:, :, :4], before[:, :, 1:5])
    kv = filled(6, 6)
    kv.compact([0, 1, 2], 2)  # forward overlap: dst beyond some sources
    torch.testing.assert_close(kv.v[:, :, 2:5], before[:, :, 0:3])
    torch.testing.assert_close(kv.v[:, :, :2], before[:, :, :2])


@pytest.mark.parametrize("src,dst", [([5], 0), ([-1], 0), ([0, 7], 1), ([0], 6), ([0], -1)])
def test_compact_rejects_bad_arguments(src, dst):
    kv = filled(5, 8)
    before = kv.k.clone()
    with pytest.raises(ValueError):
        kv.compact(src, dst)
    assert kv.length == 5
    torch.testing.assert_close(kv.k, before)


def test_compact_past_capacity_raises_clean_error():
    kv = filled(5, 6)
    with pytest.raises((ValueError, ContextFullError)):
        kv.compact([0, 1, 2], 4)  # would write slots 4, 5, 6 of a 6-slot buffer
    assert kv.length == 5
