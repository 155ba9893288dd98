"""The fast CPU draft: ``default-draft-int4``, the default draft exported to ONNX with int4 weights.

On a CPU edge this is the draft ``rapid demo`` and ``rapid bench`` use by default: one ONNX
Runtime step of Qwen2.5-Coder-0.5B takes 17 ms with int4 weights (MatMulNBits, int8 activations)
against 127 ms for the bf16 PyTorch draft and 103 ms for fp32 ONNX (Zen 4 core, 1 thread). It is
built once into the cache (``rapid export --quantize int4``: about two minutes) and reused.
"""

from __future__ import annotations

from rapid import models
from rapid.core.manifest import is_export_dir
from rapid.export.quantize import QuantConfig, ensure_quantized_export

FAST_DRAFT = "default-draft-int4"  # the default draft exported to ONNX, weights int4 (MatMulNBits)


def resolve_draft(spec: str) -> str:
    """An export folder as is; ``default-draft-int4`` built once in the cache; else a model spec."""
    if is_export_dir(spec):
        return spec
    if spec == FAST_DRAFT:
        models.fetch_default(("draft",))
        return str(ensure_quantized_export("default-draft", models.cache_dir() / "exports" / FAST_DRAFT,
                                           QuantConfig("int4")))
    if spec == "default-draft":
        models.fetch_default(("draft",))
    return models.resolve_model(spec)
