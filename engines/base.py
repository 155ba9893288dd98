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

from rapid.errors import ContextFullError


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


def check_step_args(kv_len: int, capacity: int, tokens: Sequence[int], positions: Sequence[int],
                    allowed: np.ndarray) -> int:
    """Validate a step's shapes; return T."""
    t = len(tokens)
    if t == 0:
        raise ValueError("a step needs at least one token")
    if len(positions) != t:
        raise ValueError(f"{len(positions)} positions for {t} tokens")
    if allowed.shape != (t, kv_len + t):
        raise ValueError(f"allowed must be [{t}, {kv_len + t}], got {list(allowed.shape)}")
    if kv_len + t > capacity:
        raise ContextFullError(f"draft KV cache full: {kv_len} + {t} > capacity {capacity}")
    return t
