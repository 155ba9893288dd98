"""The target's verify curve: milliseconds for one tree forward of T tokens after a prefix.

``rapid doctor`` prints it for the loaded target and ``rapid.runtime`` defaults follow its
shape: where verifying T = 8 or 16 tokens costs about one step (bf16 on a CPU with native bf16,
a GPU), a wide tree is nearly free; where cost grows with T (fp32 on a CPU), it is not. Each T
is timed ``repeats`` times on a fresh chain of T tokens, the sizes interleaved; the median is reported.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rapid.core.sampling import SamplingParams
from rapid.modeling import Decoder
from rapid.server.target import TargetSession

# the sizes timed (``rapid serve`` at start-up, ``rapid doctor``): both sides of a 16-row block,
# where kernels step (AMX tiles: T=16 250 ms, T=17 279, flat again to 32, then T=33 512; AMX
# class, 12-07; interpolated 16 -> 32, the flat size read 16-22 nodes by run, 15 with T=17)
CURVE_TOKENS = (1, 4, 8, 16, 17, 24, 32)
CURVE_PREFIX = 64  # prompt tokens before the tree
CURVE_REPEATS = 3  # interleaved passes (the median drops one slow pass)


@dataclass(slots=True, frozen=True)
class CurvePoint:
    tokens: int  # T: the root plus T - 1 chain nodes
    ms: float  # median forward time


def measure_curve(model: Decoder, tokens: Sequence[int] = CURVE_TOKENS, prefix: int = CURVE_PREFIX,
                  repeats: int = CURVE_REPEATS, seed: int = 0,
                  clock: Callable[[], float] = time.perf_counter) -> list[CurvePoint]:
    """Median ms of one tree forward of ``T`` tokens after a ``prefix``-token prompt, per T.

    The sizes are timed in interleaved passes (a warm-up pass, then ``repeats`` passes, each
    timing every T once), so a slow stretch of the machine (another process, a frequency dip)
    lands on one pass of every size, which the median drops, not on every sample of one size:
    timed size after size, one such stretch read T=16 as 361 ms against 250 and halved
    ``--budget auto`` (AMX class, 12-07)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    rng = np.random.default_rng(seed)
    prompt = [int(x) for x in rng.integers(0, model.config.vocab_size, prefix)]
    session = TargetSession(model, prompt, SamplingParams(), capacity=prefix + max(tokens) + 8,
                            max_nodes=max(tokens))
    chains = {t: [int(x) for x in rng.integers(0, model.config.vocab_size, t - 1)] for t in tokens}
    times: dict[int, list[float]] = {t: [] for t in tokens}
    for _ in range(repeats + 1):  # the first pass warms up
        for t in tokens:
            t0 = clock()
            session.logits(session.forward_tree(chains[t], list(range(-1, t - 2))))  # changes nothing; waits for a GPU
            times[t].append((clock() - t0) * 1000)
    return [CurvePoint(t, statistics.median(times[t][1:])) for t in tokens]


FLAT_TOLERANCE = 1.2  # "flat": a tree forward costs at most 1.2 one-token steps


def flat_nodes(points: Sequence[CurvePoint], tolerance: float = FLAT_TOLERANCE) -> int:
    """The most tree nodes N whose forward (T = 1 + N) stays within ``tolerance`` × the T = 1 step,
    linearly interpolated between the measured T; at least 1, at most the largest measured T - 1.

        N = max { T - 1 : ms(T) <= tolerance · ms(1) }
    """
    pts = sorted(points, key=lambda p: p.tokens)
    if not pts or pts[0].tokens != 1:
        raise ValueError("the curve needs its T = 1 point")
    limit = tolerance * pts[0].ms
    best = 1.0
    for a, b in zip(pts, pts[1:], strict=False):
        if b.ms <= limit:
            best = b.tokens
            continue
        if a.ms <= limit < b.ms:  # crosses between a and b
            best = a.tokens + (limit - a.ms) / (b.ms - a.ms) * (b.tokens - a.tokens)
        break
    return max(1, int(best) - 1)


def wire_curve(points: Sequence[CurvePoint]) -> tuple[list[int], list[int]]:
    """The curve as ``Ready`` carries it: (tree nodes after the root = T - 1, whole microseconds)."""
    return [p.tokens - 1 for p in points], [max(1, round(p.ms * 1000)) for p in points]


def curve_line(points: Sequence[CurvePoint]) -> str:
    return ", ".join(f"T={p.tokens} {p.ms:.0f} ms" for p in points)


def weight_bytes(model: Decoder) -> int:
    """Bytes of the weights one decode step streams: every parameter once, except an untied input
    embedding (a step gathers only its own rows of it)."""
    gathered = model.embed_tokens.weight
    streamed = {id(p): p for p in model.parameters()
                if p is not gathered or p is model.lm_head.weight}
    return sum(p.numel() * p.element_size() for p in streamed.values())


def read_bandwidth_gbs(nbytes: int = 1 << 30, repeats: int = 3) -> float:
    """Memory read bandwidth of this thread, GB/s: the median of summing an ``nbytes`` buffer."""
    import torch

    buf = torch.ones(nbytes // 4, dtype=torch.float32)
    buf.sum()  # fault the pages in
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        buf.sum()
        times.append(time.perf_counter() - t0)
    return nbytes / statistics.median(times) / 1e9


def roofline_line(model: Decoder, t1_ms: float, bandwidth_gbs: float) -> str:
    """The T = 1 step against its physical limit: weight bytes / memory bandwidth."""
    gb = weight_bytes(model) / 1e9
    limit_ms = gb / bandwidth_gbs * 1000
    return (f"{gb:.2f} GB of weights / {bandwidth_gbs:.1f} GB/s = {limit_ms:.0f} ms per step at best; "
            f"measured T=1 {t1_ms:.0f} ms ({limit_ms / t1_ms:.0%} of the limit)")
