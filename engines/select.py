"""Pick and open a draft backend: ``open_engine(kind, source, capacity)``.

``kind``:

- ``"torch"``: ``source`` is a model spec (HF id, folder, .gguf, ``default-draft``) — or an
  export folder, in which case the model it was exported from (manifest) is loaded.
- ``"onnx"``: ``source`` is an export folder holding ``draft.onnx`` (ONNX Runtime).
- ``"trt"``: ``source`` is an export folder holding ``draft.engine`` (TensorRT + pycuda).
- ``"auto"``: trt if tensorrt and pycuda import and the folder has ``draft.engine``, else
  onnx if it has ``draft.onnx`` (and onnxruntime imports), else torch. The choice and the reason
  are logged (and returned by :func:`choose_backend`).
"""

from __future__ import annotations

import importlib.util
import logging
import os
from pathlib import Path
from typing import Any

from rapid.core.errors import RapidError
from rapid.core.manifest import ENGINE_FILE, ONNX_FILE, is_export_dir, load_manifest
from rapid.core.optional import import_optional
from rapid.core.precision import choose_dtype, cpu_flags, native_bf16
from rapid.engines.ort_engine import OrtEngine
from rapid.engines.trt_engine import TrtEngine

log = logging.getLogger("rapid.engines")

KINDS = ("torch", "onnx", "trt", "auto")


class EngineSelectError(RapidError):
    """No backend can open the given source."""


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def trt_available() -> tuple[bool, str]:
    """(usable, reason) for the TensorRT backend, without importing CUDA."""
    missing = [m for m in ("tensorrt", "pycuda") if not _has_module(m)]
    if missing:
        return False, f"{' and '.join(missing)} not installed"
    return True, "tensorrt and pycuda importable"


def choose_backend(kind: str, source: str | os.PathLike[str]) -> tuple[str, str]:
    """Resolve ``kind`` (``auto`` included) for ``source``; return ``(kind, reason)``."""
    if kind not in KINDS:
        raise EngineSelectError(f"unknown engine kind {kind!r}; choose one of {', '.join(KINDS)}")
    if kind != "auto":
        return kind, "asked for explicitly"
    folder = Path(source).expanduser()
    if not is_export_dir(folder):
        return "torch", f"{source} is not an export folder (no manifest.json)"
    why_not: list[str] = []
    ok, why = trt_available()
    if ok and (folder / ENGINE_FILE).is_file():
        return "trt", f"{ENGINE_FILE} present and {why}"
    why_not.append(f"trt: {why}" if not ok else f"trt: no {ENGINE_FILE}")
    if (folder / ONNX_FILE).is_file():
        if _has_module("onnxruntime"):
            return "onnx", f"{ONNX_FILE} present ({'; '.join(why_not)})"
        why_not.append("onnx: onnxruntime not installed")
    else:
        why_not.append(f"onnx: no {ONNX_FILE}")
    return "torch", f"fallback ({'; '.join(why_not)})"


def _torch_model_spec(source: str | os.PathLike[str]) -> str:
    """A model spec for the torch backend: the source itself, or the model an export came from."""
    folder = Path(source).expanduser()
    if is_export_dir(folder) and not (folder / "config.json").is_file():
        model = load_manifest(folder)["model"]
        resolved = model.get("resolved") or model.get("spec")
        if resolved and (not model.get("local") or Path(resolved).exists()):
            return str(resolved)
        return str(model.get("spec"))
    return str(source)


def _cuda_ordinal(device: str | int | None) -> int:
    """0 for None / "cuda", N for N / "N" / "cuda:N"."""
    if device is None:
        return 0
    text = str(device).strip().lower()
    if text in ("", "cuda", "gpu"):
        return 0
    try:
        return int(text.split(":", 1)[1] if text.startswith("cuda:") else text)
    except ValueError:
        raise EngineSelectError(f"device {device!r} is not a CUDA device (use N or 'cuda:N')") from None


def open_engine(kind: str = "auto", source: str | os.PathLike[str] = "default-draft",
                capacity: int | None = None, *, device: str | None = None, threads: int | None = None,
                providers: Any = None, **options: Any):
    """Open a ``DraftEngine``; see the module docstring. Logs which backend and why.

    ``capacity``: KV slots (default: the export's max_context, or 2048 for torch).
    ``device``: torch device for ``torch`` ("cpu" default), CUDA ordinal for ``trt``.
    ``threads``: intra-op threads (torch.set_num_threads / ORT intra_op_num_threads).
    ``options``: passed to the backend class (e.g. ``kv_binding`` for onnx); for torch, ``dtype``
    (default ``"auto"``: bf16 where the device computes it natively, ``rapid.core.precision``).
    """
    chosen, reason = choose_backend(kind, source)
    log.info("draft engine: %s (%s) from %s", chosen, reason, source)
    if chosen == "onnx":
        return OrtEngine(source, capacity=capacity, providers=providers, threads=threads, **options)
    if chosen == "trt":
        return TrtEngine(source, capacity=capacity, device=_cuda_ordinal(device), **options)
    import torch  # the PyTorch draft: torch is the cloud extra's, not the edge's

    torch_engine = import_optional("rapid.engines.torch_engine", "cloud")
    modeling = import_optional("rapid.modeling", "cloud")
    if threads:
        torch.set_num_threads(int(threads))
    spec = _torch_model_spec(source)
    if capacity is None:
        capacity = int(load_manifest(source)["max_context"]) if is_export_dir(source) else 2048
    dtype = options.pop("dtype", "auto")  # a torch dtype, or a rapid.core.precision name ("auto": bf16 where native)
    row_linears = options.pop("row_linears", None)  # None: where they help (_wants_row_linears)
    rowops = import_optional("rapid.engines.rowops", "cloud")
    cpu = (device or "cpu") == "cpu"
    built = cpu and rowops.available()
    if isinstance(dtype, str):
        choice = choose_dtype(dtype, device or "cpu", cpu_flags(), row_kernels=built)
        log.info("torch draft dtype %s (%s)", choice.dtype, choice.reason)
        dtype = getattr(torch, choice.dtype)
    if options:
        raise EngineSelectError(f"options {sorted(options)} do not apply to the torch backend")
    decoder, _ = modeling.load_decoder(spec, dtype=dtype)
    if _wants_row_linears(row_linears, built, dtype is torch.bfloat16):
        n = import_optional("rapid.engines.row_linear", "cloud").use_row_linears(decoder)
        log.info("torch draft: %d projections on the row kernels (%s)", n, rowops.info().isa)
    return torch_engine.TorchEngine(decoder, capacity=capacity, device=device or "cpu")


def _wants_row_linears(requested: bool | None, built: bool, bf16: bool) -> bool:
    """The draft's projections run on the row kernels (``rapid.engines.row_linear``) when asked,
    or by default on a CPU where they are ``built``, unless the draft is bf16 on a CPU that
    computes bf16 natively (torch's oneDNN path is the measured one there)."""
    if requested is not None:
        if requested and not built:
            raise EngineSelectError("row_linears needs a CPU draft and the row kernels (scripts/setup.sh builds them)")
        return requested
    return built and not (bf16 and native_bf16(cpu_flags()) is not None)


def share_engine(engine: Any) -> Any:
    """Another engine over the same loaded weights with its own KV cache (``rapid edge
    --parallel N`` holds one copy of the draft): torch engines share the module, ONNX Runtime
    engines the ``InferenceSession`` (its ``run`` is thread-safe). A TensorRT engine's contexts
    own their buffers, so it is opened again from its export folder (same capacity and prefill
    chunk): the weights then exist once per engine on the device (docs/engines.md)."""
    if engine.info.backend == "torch":
        torch_engine = import_optional("rapid.engines.torch_engine", "cloud")
        return torch_engine.TorchEngine(engine.model, capacity=engine.info.capacity, device=str(engine.device))
    if engine.info.backend == "onnx":
        return OrtEngine(engine.export_dir, capacity=engine.info.capacity, kv_binding=engine.kv_binding,
                         session=engine.session)
    if engine.info.backend == "trt":
        ordinal = int(engine.info.device.split(":")[1].split()[0])  # "cuda:N (name)"
        return TrtEngine(engine.export_dir, capacity=engine.info.capacity, device=ordinal, chunk=engine.chunk)
    raise EngineSelectError(f"cannot share a {engine.info.backend} engine")
