"""ONNX Runtime draft backend over an export folder (``rapid.export.onnx_export``).

Execution provider: TensorRT EP > CUDA EP > CPU EP among ``ort.get_available_providers()``
(or the ``providers`` given). onnxruntime-gpu silently falls back to the CPU EP when the CUDA
libraries are missing, so ``info.device`` reports ``session.get_providers()[0]`` — the provider
really in use — and a warning is logged when it is not the one asked for first.

KV cache: two preallocated buffers ``K, V [layers, kv_heads, capacity, head_dim]`` (layer ``i``
is the contiguous ``[1, kv_heads, capacity, head_dim]`` block ``K[i]``). Every step runs through
one reused ``IOBinding`` bound to raw pointers, so nothing is copied into or out of
ORT-owned memory except through the buffers below; the graph returns only the T new entries
(``present_*``), which are copied into slots ``[kv_len, kv_len+T)`` — O(T).

How the past is fed (``kv_binding``), both measured by ``scripts/bench_engines.py``:

- ``"staged"`` (default, design b): copy the valid prefix ``K[i][:, :P]`` into a contiguous
  staging buffer each step and bind it with the exact P. O(P) memcpy per step, attention over
  P keys.
- ``"window"`` (design a): bind the whole ``K[i]`` with P = capacity (zero host copy) and block
  the unused slots in the mask. Attention, the graph's own ``Concat(past, new)`` and the mask
  all become O(capacity) per layer, whatever P is.

The graph concatenates past and new internally anyway (an O(P) copy inside ORT), so "window"
saves one O(P) memcpy but pays O(capacity) in that concat and in attention. Measured with
``scripts/bench_engines.py`` (Qwen2.5-Coder-0.5B fp32, 1 thread, capacity 2048): window was
1.5–1.8× slower than staged at P = 128 and 1.2–1.5× slower at P = 1024 for T = 1…16 (the staging
memcpy is ~0.2 MB per layer at P = 1024, negligible next to the weights), hence "staged" is
the default.

``truncate`` is a pointer move; ``compact`` gathers the kept entries along the sequence axis
(the native kernel of ``rapid.engines.native`` when it loads, numpy otherwise) — O(moved).
``step`` finishes synchronously and returns a ``ReadyHandle`` (``ready()`` is True at once).

Only numpy and onnxruntime are needed (no torch), as on an edge device.

GPU providers: the KV cache stays in host memory here (ORT copies the bound host buffers to
the device each step); the device-resident GPU path is the TensorRT backend
(``rapid.engines.trt_engine``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rapid.core.errors import RapidError
from rapid.core.manifest import ONNX_FILE, input_names, load_manifest, numpy_dtype, output_names
from rapid.engines import native
from rapid.engines.base import EngineInfo, ReadyHandle, step_inputs

log = logging.getLogger("rapid.engines.onnx")

PREFERRED_PROVIDERS = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
MASK_BLOCKED = -1e9  # the exporter's additive "blocked" value (rapid.modeling.MASK_MIN)


def blocked_value(dtype: np.dtype) -> float:
    """The additive "blocked" value in ``dtype``, as ``rapid.modeling.additive_mask`` makes it:
    -1e9, or half the most negative finite value where -1e9 does not fit (fp16: -32752)."""
    return max(MASK_BLOCKED, float(np.finfo(dtype).min) / 2)
KV_BINDINGS = ("staged", "window")


class OrtEngineError(RapidError):
    """The ONNX Runtime backend cannot start (missing package, bad export, bad options)."""


def _import_ort():
    try:
        import onnxruntime as ort
    except ImportError as e:
        raise OrtEngineError(
            "the ONNX backend needs onnxruntime: `pip install onnxruntime` (CPU) or "
            "`pip install onnxruntime-gpu` (CUDA; never both)") from e
    return ort


def choose_providers(available: Sequence[str], requested: Sequence[Any] | None = None) -> list[Any]:
    """Requested providers (those available) or the preferred order among ``available``."""
    if requested:
        names = [p[0] if isinstance(p, tuple) else p for p in requested]
        missing = [n for n in names if n not in available]
        if missing:
            raise OrtEngineError(f"execution provider(s) {missing} not available; onnxruntime offers {list(available)}")
        return list(requested)
    return [p for p in PREFERRED_PROVIDERS if p in available] or ["CPUExecutionProvider"]


def _trt_ep_options(export_dir: Path, manifest: dict[str, Any], capacity: int) -> dict[str, str]:
    """Explicit shape profiles so the TensorRT EP builds one engine instead of one per shape."""
    layers = manifest["architecture"]["layers"]
    kvh, hd = manifest["architecture"]["kv_heads"], manifest["architecture"]["head_dim"]
    tmax = manifest["max_tree"]

    def shapes(t: int, p: int) -> str:
        parts = [f"input_ids:1x{t}", f"position_ids:1x{t}", f"attn_mask:1x1x{t}x{p + t}"]
        parts += [f"{n}:1x{kvh}x{p}x{hd}" for n in input_names(layers)[3:]]
        return ",".join(parts)

    return {
        "trt_fp16_enable": "True" if manifest["dtype"] == "fp16" else "False",
        "trt_engine_cache_enable": "True",
        "trt_engine_cache_path": str(export_dir / "ort_trt_cache"),
        "trt_profile_min_shapes": shapes(1, 0),
        "trt_profile_opt_shapes": shapes(min(8, tmax), capacity // 2),
        "trt_profile_max_shapes": shapes(capacity, capacity),
    }


class OrtEngine:
    """``DraftEngine`` on ONNX Runtime; see the module docstring."""

    def __init__(self, export_dir: str | Path, capacity: int | None = None, providers: Sequence[Any] | None = None,
                 *, kv_binding: str = "staged", threads: int | None = None,
                 session_options: Any = None, session: Any = None) -> None:
        ort = _import_ort()
        self.export_dir = Path(export_dir).expanduser()
        m = self.manifest = load_manifest(self.export_dir)
        onnx_path = self.export_dir / m["files"].get("onnx", ONNX_FILE)
        if not onnx_path.is_file():
            raise OrtEngineError(f"{onnx_path} is missing (the manifest names it); export again")
        if kv_binding not in KV_BINDINGS:
            raise OrtEngineError(f"kv_binding must be one of {KV_BINDINGS}, got {kv_binding!r}")
        arch = m["architecture"]
        cap = int(capacity if capacity is not None else m["max_context"])
        if not 1 <= cap <= int(m["max_context"]):
            raise OrtEngineError(f"capacity {cap} outside [1, max_context {m['max_context']}] of this export; "
                                 "export again with a larger --max-context")
        self.layers, self.kv_heads, self.head_dim = arch["layers"], arch["kv_heads"], arch["head_dim"]
        self.vocab = arch["vocab"]
        self.dtype = np.dtype(numpy_dtype(m))
        self.kv_binding = kv_binding
        self._blocked = blocked_value(self.dtype)
        self._in_names = input_names(self.layers)
        self._out_names = output_names(self.layers)

        so = session_options or ort.SessionOptions()
        if session_options is None:
            so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            so.log_severity_level = 3
            if threads:
                so.intra_op_num_threads = int(threads)
                so.inter_op_num_threads = 1
        chosen = choose_providers(ort.get_available_providers(), providers)
        chosen = [("TensorrtExecutionProvider", _trt_ep_options(self.export_dir, m, cap))
                  if p == "TensorrtExecutionProvider" else p for p in chosen]
        if session is not None:  # share one loaded model between engines (e.g. benchmarks)
            self.session = session
        else:
            try:
                self.session = ort.InferenceSession(str(onnx_path), so, providers=chosen)
            except Exception as e:  # onnxruntime raises its own exception types
                raise OrtEngineError(f"onnxruntime cannot load {onnx_path}: {e}") from e
        self.provider = self.session.get_providers()[0]
        first = chosen[0][0] if isinstance(chosen[0], tuple) else chosen[0]
        if self.provider != first:
            log.warning("asked for %s but onnxruntime runs %s (missing GPU libraries?)", first, self.provider)
        log.info("onnx engine: %s on %s, capacity %d, kv binding %s", onnx_path, self.provider, cap, kv_binding)
        self.info = EngineInfo("onnx", self.provider, self.vocab, cap, tuple(m.get("eos_token_ids", ())))

        # one buffer [2, layers, kvh, cap, hd]: K = [0], V = [1]; layer i of K is the C-contiguous
        # [kvh, cap, hd] block K[i]; a compaction is a single gather over both
        self._kv = np.zeros((2, self.layers, self.kv_heads, cap, self.head_dim), self.dtype)
        self.k, self.v = self._kv[0], self._kv[1]
        # staged binding: contiguous [kvh, P, hd] views are carved out of these per step
        self._stage_k = np.empty(self.k.size, self.dtype) if kv_binding == "staged" else None
        self._stage_v = np.empty(self.v.size, self.dtype) if kv_binding == "staged" else None
        self._present = np.empty(0, self.dtype)  # [2L, kvh, T, hd], grown on demand, reused
        self._io = self.session.io_binding()
        self._len = 0

    # ------------------------------------------------------------------------- protocol --

    @property
    def kv_len(self) -> int:
        return self._len

    def kv_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The raw cache buffers ``(K, V)``, ``[layers, kv_heads, capacity, head_dim]`` (no copy)."""
        return self.k, self.v

    def step(self, tokens: Sequence[int], positions: Sequence[int], allowed: np.ndarray,
             rows: Sequence[int] | None = None) -> ReadyHandle:
        p = self._len
        inp = step_inputs(p, self.info.capacity, tokens, positions, allowed, vocab=self.vocab, rows=rows)
        t, allowed = len(inp.ids), inp.allowed
        ids = np.ascontiguousarray(inp.ids.reshape(1, t))
        pos = np.ascontiguousarray(inp.pos.reshape(1, t))
        kvh, hd, cap = self.kv_heads, self.head_dim, self.info.capacity
        if self.kv_binding == "window":
            # past = every slot; slots [P, cap) hold stale data and are blocked
            past_len = cap
            mask = np.full((1, 1, t, cap + t), self._blocked, self.dtype)
            mask[0, 0, :, :p] = np.where(allowed[:, :p], 0.0, self._blocked)
            mask[0, 0, :, cap:] = np.where(allowed[:, p:], 0.0, self._blocked)
        else:
            past_len = p
            mask = np.where(allowed, 0.0, self._blocked).astype(self.dtype)[None, None]
        need = 2 * self.layers * kvh * t * hd
        if self._present.size < need:
            self._present = np.empty(max(need, 2 * self._present.size), self.dtype)
        present = self._present[:need].reshape(2 * self.layers, kvh, t, hd)
        logits = np.empty((1, t, self.vocab), self.dtype)

        io = self._io
        el = self.dtype.type
        keep = [ids, pos, mask]  # arrays must outlive the run
        io.bind_input("input_ids", "cpu", 0, np.int64, [1, t], ids.ctypes.data)
        io.bind_input("position_ids", "cpu", 0, np.int64, [1, t], pos.ctypes.data)
        io.bind_input("attn_mask", "cpu", 0, el, list(mask.shape), mask.ctypes.data)
        past_shape = [1, kvh, past_len, hd]
        n_past = kvh * p * hd
        for i in range(self.layers):
            for j, (buf, stage) in enumerate(((self.k, self._stage_k), (self.v, self._stage_v))):
                if self.kv_binding == "window":
                    src = buf[i]
                else:
                    src = stage[i * buf[0].size:i * buf[0].size + n_past].reshape(kvh, p, hd)
                    if p:
                        np.copyto(src, buf[i, :, :p])  # the O(P) staging copy
                    keep.append(src)
                ptr = src.ctypes.data if src.size else buf[i].ctypes.data
                io.bind_input(self._in_names[3 + 2 * i + j], "cpu", 0, el, past_shape, ptr)
                io.bind_output(self._out_names[1 + 2 * i + j], "cpu", 0, el, [1, kvh, t, hd],
                               present[2 * i + j].ctypes.data)
        io.bind_output("logits", "cpu", 0, el, [1, t, self.vocab], logits.ctypes.data)
        try:
            self.session.run_with_iobinding(io)
        except Exception as e:
            raise OrtEngineError(f"onnxruntime step failed (T={t}, P={p}): {e}") from e
        # present (new entries only) -> slots [p, p+t): O(T)
        self.k[:, :, p:p + t] = present[0::2]
        self.v[:, :, p:p + t] = present[1::2]
        self._len = p + t
        out = logits[0]
        if inp.rows is not None:
            out = out[inp.rows]
        return ReadyHandle(np.ascontiguousarray(out, dtype=np.float32))

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self._len:
            raise ValueError(f"truncate({length}) outside [0, {self._len}]")
        self._len = length

    def compact(self, src_slots: Sequence[int], dst_start: int) -> None:
        src = [int(x) for x in src_slots]  # plain ints: cheaper than numpy for a handful of slots
        n = len(src)
        if n and (min(src) < 0 or max(src) >= self._len):
            raise ValueError(f"compact: source slots {src} outside [0, {self._len})")
        if not 0 <= dst_start <= self._len:
            raise ValueError(f"compact: dst_start {dst_start} outside [0, {self._len}]")
        if n and src != list(range(dst_start, dst_start + n)):
            move_kv(self._kv, src, dst_start)
        self._len = dst_start + n

    def reset(self) -> None:
        self._len = 0


def move_kv(buf: np.ndarray, src: Sequence[int], dst_start: int) -> None:
    """``buf[..., dst_start + i, :] = old buf[..., src[i], :]`` along axis -2 (snapshot semantics).

    A compaction (``src`` strictly increasing and ``src[0] >= dst_start``, hence ``src[i] >=
    dst_start + i``) is also correct done move by move, so it goes to the native sequential
    gather kernel when that library loads; anything else (or no library) is a numpy fancy-index
    copy, which snapshots first.
    """
    src = [int(x) for x in src]
    n = len(src)
    if n == 0:
        return
    ordered = src[0] >= dst_start and all(a < b for a, b in zip(src, src[1:], strict=False))
    if n > 1 and ordered and _native_ok():
        native.gather_rows(buf, np.asarray(src, dtype=np.int64),
                           np.arange(dst_start, dst_start + n, dtype=np.int64), axis=-2, backend="native")
        return
    buf[..., dst_start:dst_start + n, :] = buf[..., src, :]  # fancy index copies first


_NATIVE: bool | None = None


def _native_ok() -> bool:
    global _NATIVE
    if _NATIVE is None:
        try:
            _NATIVE = bool(native.cpu_available())
        except Exception:  # optional library: any failure means "use numpy"
            _NATIVE = False
        log.info("onnx engine KV compaction: %s", "native gather kernel" if _NATIVE else "numpy")
    return _NATIVE
