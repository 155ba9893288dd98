"""TensorRT draft backend (TensorRT 10.x Python API + pycuda) over ``DIR/draft.engine``.

Build the engine with ``rapid.export.trt_build.build_trt`` (two optimisation profiles:
``prefill`` for long T, ``tree`` for T ≤ max_tree). This module imports neither tensorrt nor
pycuda at import time; constructing :class:`TrtEngine` without them raises a ``RapidError``
naming the missing module and how to get it on a Jetson. All pycuda calls live in
``rapid.engines.cuda``.

Device memory (all preallocated, nothing is allocated per step):

- cache ``K, V [layers · kv_heads, capacity, head_dim]`` (layer i, head h is row i·kvh + h);
- staging ``[layers · kv_heads, P, head_dim]`` packed per step (design b of the ONNX backend:
  exact P, one strided 2-D copy per buffer — rows = (layer, head), pitch = capacity·head_dim);
- presents ``[layers · kv_heads, T, head_dim]``, written by the engine (new entries only) and
  copied into slots ``[kv_len, kv_len+T)`` with one 2-D copy per buffer (O(T));
- ids / positions / mask / logits for up to ``chunk`` tokens per enqueue.

A step is enqueued on one CUDA stream (uploads, staging copy, ``execute_async_v3``, present
copy, logits download into pinned memory), then an event is recorded: ``handle.ready()`` is
``event.query()`` (non-blocking), ``handle.logits()`` waits on it. Two pinned I/O slots
alternate, so a handle stays valid while the next step is queued; reusing a slot first
materialises the handle that owned it.

``truncate`` is a pointer move. ``compact`` gathers rows on the device with the native kernel
``rapid_kv_gather_cuda_*`` (``rapid.engines.native.cuda_ops``) when ``librapid_kvops_cuda``
loads, else with one 2-D device copy per moved slot — O(moved) either way.

Steps longer than ``chunk`` tokens (long prefills) are run as consecutive chunks (valid because
a token never attends to a later token of its own step), which bounds the logits buffer to
``chunk × vocab``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rapid.engines.base import EngineInfo, check_step_args
from rapid.errors import RapidError
from rapid.manifest import ENGINE_FILE, input_names, load_manifest, output_names
from rapid.trt_support import TENSORRT_HINT, TrtUnavailableError, missing_modules, require_tensorrt

log = logging.getLogger("rapid.engines.trt")

MASK_BLOCKED = -1e9
class TrtEngineError(RapidError):
    """The TensorRT engine cannot be loaded or run."""


def _sequential_safe(src: np.ndarray, dst: np.ndarray) -> bool:
    """Whether doing the moves one by one equals the snapshot move (no read of a written slot)."""
    written: set[int] = set()
    for s, d in zip(src.tolist(), dst.tolist(), strict=True):
        if s in written:
            return False
        written.add(d)
    return True


class _Slot:
    """Pinned host I/O of one in-flight step."""

    def __init__(self, cu: Any, chunk: int, cap: int, vocab: int, dtype: np.dtype) -> None:
        self.ids = cu.pinned_empty(chunk, np.int64)
        self.pos = cu.pinned_empty(chunk, np.int64)
        self.mask = cu.pinned_empty(chunk * cap, dtype)
        self.logits = cu.pinned_empty(chunk * vocab, dtype)
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

    def __init__(self, engine: TrtEngine, slot: _Slot | None, rows: np.ndarray, t: int,
                 value: np.ndarray | None = None) -> None:
        self._engine, self._slot, self._rows, self._t = engine, slot, rows, t
        self._value = value

    def ready(self) -> bool:
        return self._value is not None or self._slot is None or self._slot.event.query()

    def _materialize(self) -> None:
        if self._value is None and self._slot is not None:
            with self._engine.ctx:
                self._slot.event.synchronize()
            v = self._engine.vocab
            full = self._slot.logits[:self._t * v].reshape(self._t, v)
            self._value = np.ascontiguousarray(full[self._rows], dtype=np.float32)
            self._slot = None

    def logits(self) -> np.ndarray:
        self._materialize()
        assert self._value is not None
        return self._value


class TrtEngine:
    """``DraftEngine`` on TensorRT; see the module docstring."""

    def __init__(self, export_dir: str | Path, capacity: int | None = None, device: int = 0, *,
                 chunk: int = 512) -> None:
        missing = missing_modules()
        if missing:
            hints = {"tensorrt": f"tensorrt: {TENSORRT_HINT}",
                     "pycuda": "pycuda: `pip install pycuda` (on a Jetson it builds against JetPack's CUDA; "
                               "`export PATH=/usr/local/cuda/bin:$PATH` first)"}
            raise TrtUnavailableError(f"the TensorRT backend needs {' and '.join(missing)}, not installed here. "
                                      + " | ".join(hints[m] for m in missing))
        trt = require_tensorrt()
        from rapid.engines import cuda as cu

        self._cu = cu
        self.export_dir = Path(export_dir).expanduser()
        m = self.manifest = load_manifest(self.export_dir)
        path = self.export_dir / ENGINE_FILE
        if not path.is_file():
            raise TrtEngineError(f"{path} is missing: build it with `python -m rapid.export.trt_build {self.export_dir}`")
        arch = m["architecture"]
        self.layers, self.kv_heads, self.head_dim = arch["layers"], arch["kv_heads"], arch["head_dim"]
        self.vocab = arch["vocab"]
        max_ctx = int(m.get("trt", {}).get("max_context", m["max_context"]))
        cap = int(capacity if capacity is not None else max_ctx)
        if not 1 <= cap <= max_ctx:
            raise TrtEngineError(f"capacity {cap} outside [1, {max_ctx}] of this engine's profiles")
        self._in, self._out = input_names(self.layers), output_names(self.layers)

        self.ctx = cu.CudaContext(int(device))
        with self.ctx:
            self._logger = trt.Logger(trt.Logger.WARNING)
            self._runtime = trt.Runtime(self._logger)
            self.engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
            if self.engine is None:
                raise TrtEngineError(f"TensorRT could not deserialize {path} (built with another TensorRT "
                                     "version or GPU? rebuild it on this device)")
            self.dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype("past_key_0")))
            self.logits_dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype("logits")))
            if self.logits_dtype != self.dtype:
                raise TrtEngineError("logits and KV tensors of the engine have different dtypes")
            self.stream = cu.Stream()
            # one execution context per profile: (max T, max P, context)
            self._profiles: list[tuple[int, int, Any]] = []
            for idx in range(self.engine.num_optimization_profiles):
                c = self.engine.create_execution_context()
                c.set_optimization_profile_async(idx, self.stream.handle)
                _, _, t_max = self.engine.get_tensor_profile_shape("input_ids", idx)
                _, _, p_max = self.engine.get_tensor_profile_shape("past_key_0", idx)
                self._profiles.append((int(t_max[1]), int(p_max[2]), c))
            self._profiles.sort(key=lambda x: x[0])  # smallest T range first (the tree profile)
            self.stream.synchronize()
            self.chunk = max(1, min(int(chunk), cap, max(p[0] for p in self._profiles)))

            item = self.dtype.itemsize
            rows = self.layers * self.kv_heads
            self._row_pitch = cap * self.head_dim * item
            kv_bytes = rows * self._row_pitch
            self._k, self._v = cu.DeviceBuffer(kv_bytes), cu.DeviceBuffer(kv_bytes)
            self._stage_k, self._stage_v = cu.DeviceBuffer(kv_bytes), cu.DeviceBuffer(kv_bytes)
            pres = rows * self.chunk * self.head_dim * item
            self._pres_k, self._pres_v = cu.DeviceBuffer(pres), cu.DeviceBuffer(pres)
            self._ids = cu.DeviceBuffer(self.chunk * 8)
            self._pos = cu.DeviceBuffer(self.chunk * 8)
            self._mask = cu.DeviceBuffer(self.chunk * cap * item)
            self._logits = cu.DeviceBuffer(self.chunk * self.vocab * item)
            self._slots = [_Slot(cu, self.chunk, cap, self.vocab, self.dtype) for _ in range(2)]
            self._tick = 0
            self._kvops = self._load_kvops()
        self._len = 0
        self.info = EngineInfo("trt", f"cuda:{device} ({self.ctx.name})", self.vocab, cap,
                               tuple(m.get("eos_token_ids", ())))
        log.info("trt engine: %s on %s, capacity %d, chunk %d, %s, kv compaction: %s", path, self.ctx.name,
                 cap, self.chunk, self.dtype, "native CUDA gather" if self._kvops else "2-D memcpy per row")

    @staticmethod
    def _load_kvops() -> Any:
        try:
            from rapid.engines import native

            ops = native.cuda_ops()
            return None if ops.emulation or ops.device_count()[0] == 0 else ops
        except Exception as e:  # optional accelerator; any failure means "use the memcpy path"
            log.info("native CUDA KV kernels unavailable (%s); compaction uses 2-D memcpy", e)
            return None

    # ------------------------------------------------------------------------- protocol --

    @property
    def kv_len(self) -> int:
        return self._len

    def step(self, tokens: Sequence[int], positions: Sequence[int], allowed: np.ndarray,
             rows: Sequence[int] | None = None) -> TrtHandle:
        p0 = self._len
        allowed = np.asarray(allowed, dtype=bool)
        t = check_step_args(p0, self.info.capacity, tokens, positions, allowed)
        sel = np.arange(t) if rows is None else np.asarray(list(rows), dtype=np.int64)
        toks = np.asarray(tokens, dtype=np.int64)
        pos = np.asarray(positions, dtype=np.int64)
        if t <= self.chunk:
            with self.ctx:
                slot = self._enqueue(toks, pos, allowed, p0)
            handle = TrtHandle(self, slot, sel, t)
            slot.handle = handle
            return handle
        if np.triu(allowed[:, p0:], 1).any():
            raise ValueError(f"a step of {t} > chunk {self.chunk} tokens is run in chunks, so no token may "
                             "attend to a later token of the same step")
        out = np.empty((len(sel), self.vocab), np.float32)
        with self.ctx:
            for a in range(0, t, self.chunk):
                b = min(t, a + self.chunk)
                slot = self._enqueue(toks[a:b], pos[a:b], allowed[a:b, :p0 + b], p0 + a)
                want = (sel >= a) & (sel < b)
                h = TrtHandle(self, slot, sel[want] - a, b - a)
                slot.handle = h
                if want.any():
                    out[want] = h.logits()
        return TrtHandle(self, None, sel, t, value=out)

    def _enqueue(self, toks: np.ndarray, pos: np.ndarray, allowed: np.ndarray, p: int):
        """Queue one chunk (T ≤ chunk) at cache length ``p``; returns its slot."""
        cu, s = self._cu, self.stream
        t = len(toks)
        slot = self._slots[self._tick % len(self._slots)]
        self._tick += 1
        slot.release()
        item, hd = self.dtype.itemsize, self.head_dim
        rows = self.layers * self.kv_heads
        slot.ids[:t] = toks
        slot.pos[:t] = pos
        mask = slot.mask[:t * (p + t)].reshape(t, p + t)
        mask[...] = np.where(allowed, 0.0, max(MASK_BLOCKED, float(np.finfo(self.dtype).min) / 2))
        cu.htod_async(self._ids.ptr, slot.ids[:t], s)
        cu.htod_async(self._pos.ptr, slot.pos[:t], s)
        cu.htod_async(self._mask.ptr, slot.mask[:t * (p + t)], s)
        # past: pack slots [0, p) of every (layer, head) row into [rows, p, hd] staging
        for cache, stage in ((self._k, self._stage_k), (self._v, self._stage_v)):
            cu.copy_2d_async(stage.ptr, p * hd * item, cache.ptr, self._row_pitch, p * hd * item, rows, s)
        ctx = next((c for tmax, pmax, c in self._profiles if t <= tmax and p <= pmax), None)
        if ctx is None:
            raise TrtEngineError(f"no optimisation profile covers T={t}, P={p}")
        shapes = {"input_ids": (1, t), "position_ids": (1, t), "attn_mask": (1, 1, t, p + t)}
        addrs = {"input_ids": self._ids.ptr, "position_ids": self._pos.ptr, "attn_mask": self._mask.ptr,
                 "logits": self._logits.ptr}
        layer_past = self.kv_heads * p * hd * item
        layer_new = self.kv_heads * t * hd * item
        for i in range(self.layers):
            for j, (stage, pres) in enumerate(((self._stage_k, self._pres_k), (self._stage_v, self._pres_v))):
                shapes[self._in[3 + 2 * i + j]] = (1, self.kv_heads, p, hd)
                addrs[self._in[3 + 2 * i + j]] = stage.ptr + i * layer_past
                addrs[self._out[1 + 2 * i + j]] = pres.ptr + i * layer_new
        for name, shape in shapes.items():
            if not ctx.set_input_shape(name, shape):
                raise TrtEngineError(f"TensorRT rejected shape {shape} for {name}")
        for name, ptr in addrs.items():
            ctx.set_tensor_address(name, ptr)
        if not ctx.execute_async_v3(self.stream.handle):
            raise TrtEngineError(f"execute_async_v3 failed (T={t}, P={p})")
        # presents [rows, t, hd] -> cache slots [p, p+t) of every row
        for cache, pres in ((self._k, self._pres_k), (self._v, self._pres_v)):
            cu.copy_2d_async(cache.ptr + p * hd * item, self._row_pitch, pres.ptr, t * hd * item,
                             t * hd * item, rows, s)
        cu.dtoh_async(slot.logits[:t * self.vocab], self._logits.ptr, s)
        slot.event.record(s)
        self._len = p + t
        return slot

    def kv_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of the cache ``(K, V)``, ``[layers, kv_heads, capacity, head_dim]`` (synchronises)."""
        shape = (self.layers, self.kv_heads, self.info.capacity, self.head_dim)
        out = []
        with self.ctx:
            for buf in (self._k, self._v):
                host = self._cu.pinned_empty(shape, self.dtype)
                self._cu.dtoh_async(host, buf.ptr, self.stream)
                out.append(host)
            self.stream.synchronize()
        return np.array(out[0]), np.array(out[1])

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"truncate({length}) outside [0, {self._len}]")
        self._len = length

    def compact(self, src_slots: Sequence[int], dst_start: int) -> None:
        src = np.asarray(list(src_slots), dtype=np.int64)
        n = int(src.size)
        if n and (src.min() < 0 or src.max() >= self._len):
            raise ValueError(f"compact: source slots {src.tolist()} outside [0, {self._len})")
        if not 0 <= dst_start <= self._len:
            raise ValueError(f"compact: dst_start {dst_start} outside [0, {self._len}]")
        dst = np.arange(dst_start, dst_start + n, dtype=np.int64)
        if n and not np.array_equal(src, dst):
            with self.ctx:
                self._move_rows(src, dst)
        self._len = dst_start + n

    def _move_rows(self, src: np.ndarray, dst: np.ndarray) -> None:
        cu, s = self._cu, self.stream
        rows, hd, item = self.layers * self.kv_heads, self.head_dim, self.dtype.itemsize
        cap, w = self.info.capacity, hd * item
        if self._kvops is not None and _sequential_safe(src, dst):
            for buf in (self._k, self._v):
                self._kvops.gather(buf.ptr, rows, cap, hd, self.dtype, src, dst, stream=s.handle)
            return
        if _sequential_safe(src, dst):
            for buf in (self._k, self._v):
                for a, b in zip(src.tolist(), dst.tolist(), strict=True):
                    cu.copy_2d_async(buf.ptr + b * w, self._row_pitch, buf.ptr + a * w, self._row_pitch, w, rows, s)
            return
        # general permutation: through the staging buffers (snapshot semantics)
        n = len(src)
        for buf, stage in ((self._k, self._stage_k), (self._v, self._stage_v)):
            for i, a in enumerate(src.tolist()):
                cu.copy_2d_async(stage.ptr + i * w, n * w, buf.ptr + a * w, self._row_pitch, w, rows, s)
            for i, b in enumerate(dst.tolist()):
                cu.copy_2d_async(buf.ptr + b * w, self._row_pitch, stage.ptr + i * w, n * w, w, rows, s)

    def reset(self) -> None:
        self._len = 0

    def close(self) -> None:
        """Free device memory (also done by the garbage collector)."""
        with self.ctx:
            self.stream.synchronize()
            for b in (self._k, self._v, self._stage_k, self._stage_v, self._pres_k, self._pres_v,
                      self._ids, self._pos, self._mask, self._logits):
                b.free()
        self.ctx.close()
