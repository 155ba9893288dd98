"""Shared helpers for the native KV-cache kernel tests: buffers, byte comparison, hypothesis cases."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

DTYPES = (np.float16, np.float32, np.float64)
PROPS = settings(max_examples=120, deadline=None,
                 suppress_health_check=[HealthCheck.function_scoped_fixture])


def random_buf(rng: np.random.Generator, shape, dtype) -> np.ndarray:
    """Arbitrary bit patterns (NaNs, infs, subnormals included): the kernels move bytes."""
    dt = np.dtype(dtype)
    bits = rng.integers(0, 256, size=int(np.prod(shape)) * dt.itemsize, dtype=np.uint8)
    return bits.view(dt).reshape(shape)


def same_bytes(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()


@st.composite
def gather_case(draw, max_n: int = 40):
    dtype = draw(st.sampled_from(DTYPES))
    lead = draw(st.lists(st.integers(1, 4), min_size=0, max_size=2))
    cap = draw(st.integers(1, 40))
    trail = draw(st.lists(st.integers(1, 9), min_size=1, max_size=2))
    shape = (*lead, cap, *trail)
    axis = len(lead) - len(shape)  # the sequence axis, counted from the end
    n = draw(st.integers(0, max_n))
    idx = st.lists(st.integers(0, cap - 1), min_size=n, max_size=n)
    return dtype, shape, axis, draw(idx), draw(idx), draw(st.integers(0, 2**32 - 1))


@st.composite
def range_case(draw):
    dtype = draw(st.sampled_from(DTYPES))
    outer = draw(st.integers(1, 5))
    inner = draw(st.integers(1, 9))
    scap = draw(st.integers(1, 40))
    dcap = draw(st.integers(1, 40))
    n = draw(st.integers(0, min(scap, dcap)))
    ss = draw(st.integers(0, scap - n))
    ds = draw(st.integers(0, dcap - n))
    return dtype, outer, inner, scap, dcap, ss, ds, n, draw(st.integers(0, 2**32 - 1))


def range_buffers(case) -> tuple[np.ndarray, np.ndarray]:
    """The random source [outer, scap, inner] and destination [outer, dcap, inner] of a range_case."""
    dtype, outer, inner, scap, dcap, *_, seed = case
    rng = np.random.default_rng(seed)
    return random_buf(rng, (outer, scap, inner), dtype), random_buf(rng, (outer, dcap, inner), dtype)
