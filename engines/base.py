"""The draft-engine interface every backend (PyTorch, ONNX Runtime, TensorRT) implements.

An engine owns a draft model and its KV cache. The runtime drives it with explicit tokens,
positions and a boolean attention matrix, so a tree step, a causal prefill and a single decode
are the same call:

    step(tokens [T], positions [T], allowed [T, kv_len + T], rows) -> StepHandle
        appends T KV entries at slots kv_len … kv_len+T-1, computes logits for ``rows`` of T

``allowed[i, j]`` is True when new token i may attend to slot j (slots ≥ kv_len are the new
tokens themselves). ``StepHandle.ready()`` never blocks (a CUDA event query on GPU backends,
always True on CPU ones); ``logits()`` waits and returns ``[R, V]`` float32.

KV primitives, all O(moved entries): ``truncate(n)`` (rollback / boundary restore) and
``compact(src_slots, dst_start)`` (keep an accepted path or remap a kept branch).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from rapid.core.errors import ContextFullError, RapidError


@dataclass(slots=True, frozen=True)
class EngineInfo:
    backend: str  # "torch" | "onnx" | "trt"
    device: str  # what really runs it, e.g. "cpu", "cuda:0", "CPUExecutionProvider"
    vocab_size: int
    capacity: int  # max KV entries (context + tree slots)
    eos_token_ids: tuple[int, ...]


@runtime_checkable
class StepHandle(Protocol):
    def ready(self) -> bool: ...

    def logits(self) -> np.ndarray: ...  # [R, V] float32


@runtime_checkable
class DraftEngine(Protocol):
    info: EngineInfo

    @property
    def kv_len(self) -> int: ...

    def step(self, tokens: Sequence[int], positions: Sequence[int], allowed: np.ndarray,
             rows: Sequence[int] | None = None) -> StepHandle: ...

    def truncate(self, length: int) -> None: ...

    def compact(self, src_slots: Sequence[int], dst_start: int) -> None: ...

    def reset(self) -> None: ...


@dataclass(slots=True)
class ReadyHandle:
    """A step that finished synchronously (CPU backends)."""

    value: np.ndarray  # [R, V]

    def ready(self) -> bool:
        return True

    def logits(self) -> np.ndarray:
        return self.value


class StepInputError(RapidError, ValueError):
    """A step's tokens, positions, ``allowed`` matrix or ``rows`` have the wrong type, shape or range."""


@dataclass(slots=True, frozen=True)
class StepInputs:
    """A validated step: what every backend feeds its graph."""

    ids: np.ndarray  # [T] int64, each in [0, vocab)
    pos: np.ndarray  # [T] int64, each >= 0
    allowed: np.ndarray  # [T, kv_len + T] bool
    rows: np.ndarray | None  # [R] int64, each in [0, T); None = all T rows


def _int_vector(values: Sequence[int], what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise StepInputError(f"{what} must be a 1-D sequence, got shape {list(arr.shape)}")
    if arr.size and arr.dtype.kind not in "iu":  # bool and float are refused, not rounded
        raise StepInputError(f"{what} must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def step_inputs(kv_len: int, capacity: int, tokens: Sequence[int], positions: Sequence[int],
                allowed: np.ndarray, *, vocab: int | None = None,
                rows: Sequence[int] | None = None) -> StepInputs:
    """Validate a step's arguments (types, shapes, ranges) and return them as int64 / bool arrays.

    ``allowed`` must already be boolean: a float or int matrix is refused, because an additive
    mask (0 = attend, -1e9 = blocked) read as booleans would invert every entry.
    """
    ids = _int_vector(tokens, "tokens")
    t = len(ids)
    if t == 0:
        raise StepInputError("a step needs at least one token")
    pos = _int_vector(positions, "positions")
    if len(pos) != t:
        raise StepInputError(f"{len(pos)} positions for {t} tokens")
    mask = np.asarray(allowed)
    if mask.dtype != np.bool_:
        raise StepInputError(f"allowed must be a boolean matrix (True = may attend), got dtype {mask.dtype}")
    if mask.shape != (t, kv_len + t):
        raise StepInputError(f"allowed must be [{t}, {kv_len + t}], got {list(mask.shape)}")
    if kv_len + t > capacity:
        raise ContextFullError(f"draft KV cache full: {kv_len} + {t} > capacity {capacity}")
    if vocab is not None and (ids.min() < 0 or ids.max() >= vocab):
        raise StepInputError(f"token ids must lie in [0, {vocab}), got [{ids.min()}, {ids.max()}]")
    if pos.min() < 0:
        raise StepInputError(f"positions must be >= 0, got {pos.min()}")
    sel = None
    if rows is not None:
        sel = _int_vector(list(rows), "rows")
        if sel.size and (sel.min() < 0 or sel.max() >= t):
            raise StepInputError(f"rows must lie in [0, {t}), got [{sel.min()}, {sel.max()}]")
    return StepInputs(ids, pos, mask, sel)
