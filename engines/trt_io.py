"""Pieces of the TensorRT backend that touch TensorRT objects but hold no engine state.

Errors, the pinned I/O slots and step handles, the check of a deserialized engine's I/O
tensors against the export's manifest, and the execution contexts: one per optimisation
profile, ``USER_MANAGED``, all given the same activation scratch block (they never run at the
same time: one stream serialises them), sized ``device_memory_size_v2`` = the largest profile's
need. With TensorRT's default ``STATIC`` strategy each context would allocate that maximum for
itself, doubling the scratch on an 8 GB Orin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rapid.core.errors import RapidError


class TrtEngineError(RapidError):
    """The TensorRT engine cannot be loaded or run."""


class TrtTensorError(TrtEngineError):
    """TensorRT refused, or the engine disagrees with the manifest about, one named I/O tensor."""

    def __init__(self, tensor: str, what: str, detail: object) -> None:
        self.tensor, self.what = tensor, what  # what: "shape" | "address" | "dtype" | "missing"
        super().__init__(f"TensorRT tensor {tensor!r}: {what} {detail}")


def runs(rows: np.ndarray) -> list[tuple[int, int, int]]:
    """``(out_index, first_row, count)`` of each run of consecutive rows (one download each)."""
    if len(rows) == 0:
        return []
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    starts = [0, *breaks.tolist()]
    ends = [*breaks.tolist(), len(rows)]
    return [(a, int(rows[a]), b - a) for a, b in zip(starts, ends, strict=True)]


class Slot:
    """Pinned host I/O of one in-flight step."""

    def __init__(self, cu: Any, chunk: int, cap: int, rows: int, vocab: int, dtype: np.dtype) -> None:
        self.ids = cu.pinned_empty(chunk, np.int64)
        self.pos = cu.pinned_empty(chunk, np.int64)
        self.mask = cu.pinned_empty(chunk * cap, dtype)
        self.logits = cu.pinned_empty(rows * vocab, dtype)
        self.event = cu.Event()
        self.handle: TrtHandle | None = None

    def release(self) -> None:
        """Wait for the step that used this slot and detach its handle from the buffers."""
        if self.handle is not None:
            self.handle._materialize()
            self.handle = None
        self.event.synchronize()


class TrtHandle:
    """``ready()`` = the step's CUDA event has completed; ``logits()`` waits and copies out."""

    def __init__(self, engine: Any, slot: Slot | None, n: int, value: np.ndarray | None = None) -> None:
        self._engine, self._slot, self._n = engine, slot, n  # n rows, in request order in the slot
        self._value = value

    def ready(self) -> bool:
        return self._value is not None or self._slot is None or self._slot.event.query()

    def _materialize(self) -> None:
        if self._value is None and self._slot is not None:
            with self._engine.ctx:
                self._slot.event.synchronize()
            v = self._engine.vocab
            self._value = self._slot.logits[:self._n * v].reshape(self._n, v).astype(np.float32)
            self._slot = None

    def logits(self) -> np.ndarray:
        self._materialize()
        assert self._value is not None
        return self._value


def check_engine_io(engine: Any, trt: Any, manifest: dict[str, Any], path: Path) -> None:
    """Every I/O tensor of the manifest is in the engine, with the manifest's dtype."""
    names = {engine.get_tensor_name(i) for i in range(engine.num_io_tensors)}
    io = manifest["io"]
    for spec in io["inputs"] + io["outputs"]:
        name, want = spec["name"], np.dtype(spec["dtype"])
        if name not in names:
            raise TrtTensorError(name, "missing", f"from {path}: rebuild it from this export")
        got = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
        if got != want:
            raise TrtTensorError(name, "dtype", f"is {got} in {path}, the manifest says {want}: "
                                 "rebuild the engine from this export")


def shared_contexts(engine: Any, trt: Any, cu: Any, stream: Any) -> tuple[Any, list[tuple[int, int, Any]]]:
    """``(scratch buffer, [(max T, max P, context)])``, contexts sorted by max T (tree first)."""
    size = int(engine.device_memory_size_v2 if hasattr(engine, "device_memory_size_v2")
               else engine.device_memory_size)  # TensorRT 10.0 has only the latter
    scratch = cu.DeviceBuffer(size)
    profiles: list[tuple[int, int, Any]] = []
    for idx in range(engine.num_optimization_profiles):
        c = engine.create_execution_context(trt.ExecutionContextAllocationStrategy.USER_MANAGED)
        if c is None:
            raise TrtEngineError(f"TensorRT could not create an execution context for profile {idx}")
        if hasattr(c, "set_device_memory"):
            c.set_device_memory(scratch.ptr, size)
        else:  # TensorRT 10.0
            c.device_memory = scratch.ptr
        if not c.set_optimization_profile_async(idx, stream.handle):
            raise TrtEngineError(f"TensorRT refused optimisation profile {idx}")
        _, _, t_max = engine.get_tensor_profile_shape("input_ids", idx)
        _, _, p_max = engine.get_tensor_profile_shape("past_key_0", idx)
        profiles.append((int(t_max[1]), int(p_max[2]), c))
    profiles.sort(key=lambda x: x[0])
    stream.synchronize()
    return scratch, profiles
