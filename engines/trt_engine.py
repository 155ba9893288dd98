"""TensorRT draft backend (TensorRT 10.x Python API + pycuda) over ``DIR/draft.engine``.

Build the engine with ``rapid.export.trt_build.build_trt`` (two optimisation profiles:
``prefill`` for T ≤ the prefill chunk, ``tree`` for T ≤ max_tree). This module imports neither
tensorrt nor pycuda at import time; constructing :class:`TrtEngine` without them raises a
``RapidError`` naming the missing module and how to get it on a Jetson. All pycuda calls live
in ``rapid.engines.cuda``.

Loading checks the engine against the export's manifest: every I/O tensor present with the
manifest's dtype (int64 ids / positions, the model dtype for mask, KV and logits).

Device memory (all preallocated, nothing is allocated per step; sizes in
``rapid.engines.trt_layout.plan``, worked through in ``docs/engines.md``):

- cache ``K, V [layers · kv_heads, capacity, head_dim]`` (layer i, head h is row i·kvh + h);
- staging: the past ``[kvh, P, hd]`` of every layer in its own 256-byte-aligned block
  (``trt_layout.block_layout``), packed from the cache by one 3-D copy per buffer;
- presents: the engine writes each layer's ``[kvh, T, hd]`` new entries into an aligned block;
  one 3-D copy per buffer moves them to cache slots ``[kv_len, kv_len+T)`` (O(T));
- ids / positions / mask / logits for up to ``chunk`` tokens per enqueue;
- one activation scratch block of ``device_memory_size_v2`` (the largest profile's need) shared
  by the per-profile execution contexts (``USER_MANAGED``): they run one at a time on one stream,
  so two contexts cost one scratch, not two.

Every ``set_input_shape`` / ``set_tensor_address`` result is checked: False raises
:class:`TrtTensorError` naming the tensor.

A step is enqueued on one CUDA stream (uploads, staging copy, ``execute_async_v3``, present
copy, download of the requested logits rows into pinned memory), then an event is recorded:
``handle.ready()`` is ``event.query()`` (non-blocking), ``handle.logits()`` waits on it. Two
pinned I/O slots alternate, so a handle stays valid while the next step is queued; reusing a
slot first materialises the handle that owned it. A slot holds the logits of ``rows_cap`` rows
(the tree profile's max T): a step asking for more rows, or longer than ``chunk`` tokens (long
prefills, run as consecutive chunks — valid because no token attends to a later token of its
own step), runs synchronously and downloads its rows ``rows_cap`` at a time.

``truncate`` is a pointer move. ``compact`` gathers rows on the device with the native kernel
``rapid_kv_gather_cuda_*`` (``rapid.engines.native.cuda_ops``) when ``librapid_kvops_cuda``
loads, else with one 2-D device copy per moved slot — O(moved) either way; a slot already in
place is not copied (a copy onto itself is undefined in CUDA).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rapid.core.manifest import ENGINE_FILE, input_names, load_manifest, output_names
from rapid.core.trt_support import (
    PREFILL_CHUNK,
    TENSORRT_HINT,
    TrtUnavailableError,
    missing_modules,
    require_tensorrt,
)
from rapid.engines import cuda as cu
from rapid.engines import native, trt_layout
from rapid.engines.base import EngineInfo, StepInputError, StepInputs, step_inputs
from rapid.engines.trt_io import (
    Slot,
    TrtEngineError,
    TrtHandle,
    TrtTensorError,
    check_engine_io,
    runs,
    shared_contexts,
)

log = logging.getLogger("rapid.engines.trt")

MASK_BLOCKED = -1e9
MIB = 1024**2


def _sequential_safe(src: np.ndarray, dst: np.ndarray) -> bool:
    """Whether doing the moves one by one equals the snapshot move (no read of a written slot)."""
    written: set[int] = set()
    for s, d in zip(src.tolist(), dst.tolist(), strict=True):
        if s in written:
            return False
        written.add(d)
    return True


class TrtEngine:
    """``DraftEngine`` on TensorRT; see the module docstring."""

    def __init__(self, export_dir: str | Path, capacity: int | None = None, device: int = 0, *,
                 chunk: int = PREFILL_CHUNK) -> None:
        missing = missing_modules()
        if missing:
            hints = {"tensorrt": f"tensorrt: {TENSORRT_HINT}",
                     "pycuda": "pycuda: `pip install pycuda` (on a Jetson it builds against JetPack's CUDA; "
                               "`export PATH=/usr/local/cuda/bin:$PATH` first)"}
            raise TrtUnavailableError(f"the TensorRT backend needs {' and '.join(missing)}, not installed here. "
                                      + " | ".join(hints[m] for m in missing))
        trt = require_tensorrt()
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
        built = m.get("trt")
        if built is not None and not built.get("strongly_typed", False):
            log.warning("%s was built weakly typed by an older RAPID (FP16 may reach norms and RoPE); rebuild it "
                        "with `python -m rapid.export.trt_build %s`", path, self.export_dir)
        self._in, self._out = input_names(self.layers), output_names(self.layers)
        self.ctx = cu.CudaContext(int(device))
        with self.ctx:
            self._load(trt, path)
            self.stream = cu.Stream()
            self._scratch, self._profiles = shared_contexts(self.engine, trt, cu, self.stream)
            self.chunk = max(1, min(int(chunk), cap, max(p[0] for p in self._profiles)))
            self.rows_cap = min(self.chunk, self._profiles[0][0])  # the tree profile's max T
            self._allocate(cap)
            self._kvops = self._load_kvops()
        self._len = 0
        self.info = EngineInfo("trt", f"cuda:{device} ({self.ctx.name})", self.vocab, cap,
                               tuple(m.get("eos_token_ids", ())))
        log.info("trt engine: %s on %s, capacity %d, chunk %d, %s; memory: %.1f MiB device + %.1f MiB pinned "
                 "+ %.1f MiB TensorRT scratch (shared by %d contexts); kv compaction: %s", path, self.ctx.name,
                 cap, self.chunk, self.dtype, self.plan.device / MIB, self.plan.pinned / MIB,
                 self._scratch.nbytes / MIB, len(self._profiles),
                 "native CUDA gather" if self._kvops else "2-D memcpy per row")

    def _load(self, trt: Any, path: Path) -> None:
        """Deserialize the engine and check its I/O tensors against the manifest's."""
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise TrtEngineError(f"TensorRT could not deserialize {path} (built with another TensorRT "
                                 "version or GPU? rebuild it on this device)")
        check_engine_io(self.engine, trt, self.manifest, path)
        self.dtype = np.dtype(trt.nptype(self.engine.get_tensor_dtype("past_key_0")))

    def _allocate(self, cap: int) -> None:
        """Every buffer of :func:`rapid.engines.trt_layout.plan`, at exactly its planned size."""
        cu, item = self._cu, self.dtype.itemsize
        self.plan = pl = trt_layout.plan(self.layers, self.kv_heads, self.head_dim, self.vocab, cap, self.chunk,
                                         self.rows_cap, item)
        self._row_pitch = cap * self.head_dim * item
        self._k, self._v = cu.DeviceBuffer(pl.kv), cu.DeviceBuffer(pl.kv)
        self._stage_k, self._stage_v = cu.DeviceBuffer(pl.stage), cu.DeviceBuffer(pl.stage)
        self._pres_k, self._pres_v = cu.DeviceBuffer(pl.present), cu.DeviceBuffer(pl.present)
        self._ids, self._pos = cu.DeviceBuffer(pl.index), cu.DeviceBuffer(pl.index)
        self._mask = cu.DeviceBuffer(pl.mask)
        self._logits = cu.DeviceBuffer(pl.logits)
        self._slots = [Slot(cu, self.chunk, cap, self.rows_cap, self.vocab, self.dtype)
                       for _ in range(trt_layout.SLOTS)]
        self._tick = 0

    @staticmethod
    def _load_kvops() -> Any:
        try:
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
        inp = step_inputs(p0, self.info.capacity, tokens, positions, allowed, vocab=self.vocab, rows=rows)
        t = len(inp.ids)
        sel = np.arange(t) if inp.rows is None else inp.rows
        if t > self.chunk or len(sel) > self.rows_cap:
            return TrtHandle(self, None, len(sel), value=self._step_sync(inp, sel, p0))
        with self.ctx:
            slot = self._enqueue(inp.ids, inp.pos, inp.allowed, p0)
            self._download(slot, sel)
        handle = TrtHandle(self, slot, len(sel))
        slot.handle = handle
        return handle

    def _step_sync(self, inp: StepInputs, sel: np.ndarray, p0: int) -> np.ndarray:
        """A step longer than ``chunk`` or wanting more than ``rows_cap`` rows, run to completion."""
        t, v, cap = len(inp.ids), self.vocab, self.rows_cap
        if t > self.chunk and np.triu(inp.allowed[:, p0:], 1).any():
            raise StepInputError(f"a step of {t} > chunk {self.chunk} tokens is run in chunks, so no token "
                                 "may attend to a later token of the same step")
        out = np.empty((len(sel), v), np.float32)
        with self.ctx:
            for a in range(0, t, self.chunk):
                b = min(t, a + self.chunk)
                slot = self._enqueue(inp.ids[a:b], inp.pos[a:b], inp.allowed[a:b, :p0 + b], p0 + a)
                want = np.flatnonzero((sel >= a) & (sel < b))
                for g in range(0, len(want), cap):
                    part = want[g:g + cap]
                    self._download(slot, sel[part] - a)
                    slot.event.synchronize()
                    out[part] = slot.logits[:len(part) * v].reshape(len(part), v)
        return out

    def _context(self, t: int, p: int) -> Any:
        ctx = next((c for tmax, pmax, c in self._profiles if t <= tmax and p <= pmax), None)
        if ctx is None:
            raise TrtEngineError(f"no optimisation profile covers T={t}, P={p}")
        return ctx

    def _bind(self, ctx: Any, t: int, p: int) -> tuple[trt_layout.BlockLayout, trt_layout.BlockLayout]:
        """Set every input shape and tensor address for a (T, P) step; returns the block layouts."""
        kvh, hd, item = self.kv_heads, self.head_dim, self.dtype.itemsize
        past = trt_layout.block_layout(p, kvh, hd, item)
        new = trt_layout.block_layout(t, kvh, hd, item)
        shapes = {"input_ids": (1, t), "position_ids": (1, t), "attn_mask": (1, 1, t, p + t)}
        addrs = {"input_ids": self._ids.ptr, "position_ids": self._pos.ptr, "attn_mask": self._mask.ptr,
                 "logits": self._logits.ptr}
        for i in range(self.layers):
            for j, (stage, pres) in enumerate(((self._stage_k, self._pres_k), (self._stage_v, self._pres_v))):
                shapes[self._in[3 + 2 * i + j]] = (1, kvh, p, hd)
                addrs[self._in[3 + 2 * i + j]] = stage.ptr + past.offset(i)
                addrs[self._out[1 + 2 * i + j]] = pres.ptr + new.offset(i)
        for name, shape in shapes.items():
            if not ctx.set_input_shape(name, shape):
                raise TrtTensorError(name, "shape", f"{shape} refused (outside the engine's profile?)")
        for name, ptr in addrs.items():
            if not ctx.set_tensor_address(name, ptr):
                raise TrtTensorError(name, "address", f"{ptr:#x} refused (TensorRT needs 256-byte alignment)")
        return past, new

    def _enqueue(self, toks: np.ndarray, pos: np.ndarray, allowed: np.ndarray, p: int) -> Slot:
        """Queue one chunk (T ≤ chunk) at cache length ``p``; returns its slot (event recorded)."""
        cu, s = self._cu, self.stream
        t = len(toks)
        ctx = self._context(t, p)
        slot = self._slots[self._tick % len(self._slots)]
        self._tick += 1
        slot.release()
        slot.ids[:t] = toks
        slot.pos[:t] = pos
        mask = slot.mask[:t * (p + t)].reshape(t, p + t)
        mask[...] = np.where(allowed, 0.0, max(MASK_BLOCKED, float(np.finfo(self.dtype).min) / 2))
        past, new = self._bind(ctx, t, p)
        cu.htod_async(self._ids.ptr, slot.ids[:t], s)
        cu.htod_async(self._pos.ptr, slot.pos[:t], s)
        cu.htod_async(self._mask.ptr, slot.mask[:t * (p + t)], s)
        L, kvh, rp = self.layers, self.kv_heads, self._row_pitch
        for cache, stage in ((self._k, self._stage_k), (self._v, self._stage_v)):  # slots [0, p) -> blocks
            cu.copy_3d_async(stage.ptr, past.pitch, past.height, cache.ptr, rp, kvh, past.pitch, kvh, L, s)
        if not ctx.execute_async_v3(self.stream.handle):
            raise TrtEngineError(f"execute_async_v3 failed (T={t}, P={p})")
        col = p * self.head_dim * self.dtype.itemsize
        for cache, pres in ((self._k, self._pres_k), (self._v, self._pres_v)):  # blocks -> slots [p, p+t)
            cu.copy_3d_async(cache.ptr + col, rp, kvh, pres.ptr, new.pitch, new.height, new.pitch, kvh, L, s)
        slot.event.record(s)
        self._len = p + t
        return slot

    def _download(self, slot: Slot, rows: np.ndarray) -> None:
        """Queue the logits of ``rows`` (local to the last enqueue) into the slot; record its event."""
        v, item = self.vocab, self.dtype.itemsize
        for out, first, n in runs(rows):
            self._cu.dtoh_async(slot.logits[out * v:(out + n) * v], self._logits.ptr + first * v * item, self.stream)
        slot.event.record(self.stream)

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
            moves = [(a, b) for a, b in zip(src.tolist(), dst.tolist(), strict=True) if a != b]  # a == b: in place
            for buf in (self._k, self._v):
                for a, b in moves:
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
                      self._ids, self._pos, self._mask, self._logits, self._scratch):
                b.free()
        self.ctx.close()
