"""Quantization of an exported draft's weights for ONNX Runtime on a CPU.

A draft's numerics never change RAPID's output (the cloud decides every token), only how often
the target accepts a proposal, so the draft may trade accuracy for speed. ``quantize_export``
rewrites every MatMul with a constant weight of ``DIR/draft.onnx``, by scheme:

- ``int4`` / ``int8``: weight-only ``MatMulNBits``,

      W ≈ scale_b · (q - zero),   q ∈ [−2^(bits−1), 2^(bits−1))   per block b of ``block_size``
                                                                  input channels (symmetric)

  ``accuracy_level`` 4 computes with int8 activations (AVX512-VNNI / AVX-VNNI / Arm i8mm dot
  products). Measured on a Zen 4 core (1 thread, 128-token prefix) for Qwen2.5-Coder-0.5B: fp32
  ORT 103 ms per one-token step, int8 38 ms, int4 (block 128) 17 ms; T = 8 tree steps 149 / 85 /
  55 ms.
- ``int8-dynamic``: ORT's dynamic quantization, ``W ≈ scale_c · q`` per output channel c, and
  each step's activations quantized to uint8 on the fly (``DynamicQuantizeLinear`` +
  ``MatMulInteger``, which ORT fuses into ``MatMulIntegerToFloat``): MLAS's u8s8 GEMM, on AMX
  int8 tiles where the CPU has them. Twice int4's weight bytes, so a one-row step is slower,
  but the cost per extra row is a fraction of ``MatMulNBits``' (a flat curve for tree steps).
  Measured on the Intel Xeon with AMX (1 thread, 128-token prefix), steps of T = 1 / 2 / 4 / 8 /
  16 rows: int4 32-35 / 38-41 / 50-52 / 74-77 / 120-127 ms, int8-dynamic 45-49 / 48-52 / 53-58 /
  63-72 / 79-87 ms (three runs).

The embedding gather and the attention stay fp32, so the graph's I/O is unchanged and every
backend reads it as before.

Parity is stated against the fp32 graph it came from: the top-1 (argmax) agreement over the
positions of ``HELD_IN_PROMPTS`` plus a greedy continuation, teacher-forced (one forward of the
whole sequence per prompt), and the largest logit difference.
"""

from __future__ import annotations

import logging
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rapid.core.errors import RapidError
from rapid.core.manifest import ONNX_FILE, input_names, load_manifest, write_manifest
from rapid.export.onnx_export import export_onnx
from rapid.export.parity import ort_session

log = logging.getLogger("rapid.export")

SCHEMES = {"int4": 4, "int8": 8, "int8-dynamic": 8}  # scheme -> weight bits
DYNAMIC = "int8-dynamic"  # the one scheme that is not MatMulNBits
HELD_IN_PROMPTS = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "Write a Python function that checks whether a string is a palindrome.",
    "The history of the printing press begins in",
    "import numpy as np\n\ndef softmax(x):\n",
    "Explain in two sentences what a hash map is.",
    "SELECT name, COUNT(*) FROM orders GROUP BY",
)
CONTINUATION = 24  # greedy fp32 tokens appended to each prompt before comparing
MIN_TOP1 = 0.6  # below this the quantized draft is broken, not merely less accurate


class QuantizeError(RapidError):
    """The export cannot be quantized, or its quantized graph disagrees with fp32 beyond use."""


@dataclass(slots=True, frozen=True)
class QuantConfig:
    scheme: str = "int4"  # key of SCHEMES
    block_size: int = 128  # input channels per scale (a power of two >= 16; MatMulNBits only)
    accuracy_level: int = 4  # ORT: 4 = int8 activations (VNNI); 0 = unset (MatMulNBits only)
    symmetric: bool = True

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise QuantizeError(f"quantization {self.scheme!r} is not one of {', '.join(SCHEMES)}")
        if self.block_size < 16 or self.block_size & (self.block_size - 1):
            raise QuantizeError(f"block size must be a power of two >= 16, got {self.block_size}")

    @property
    def bits(self) -> int:
        return SCHEMES[self.scheme]

    def recorded(self) -> dict[str, Any]:
        """The settings that shape the graph: the manifest's record, and what a cached export must
        match (``block_size`` and ``accuracy_level`` are MatMulNBits' alone)."""
        d = asdict(self)
        if self.scheme == DYNAMIC:
            del d["block_size"], d["accuracy_level"]
        return d

    @property
    def op(self) -> str:
        """The ONNX op the quantized weights feed."""
        return "MatMulInteger" if self.scheme == DYNAMIC else "com.microsoft.MatMulNBits"


def _quantize_dynamic(src: Path, dst: Path) -> None:
    """int8 weights per output channel, activations quantized per step; attention's MatMuls
    (no constant weight) stay fp32."""
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    dst.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer warns on the root logger that it wants shape pre-processing
    try:
        quantize_dynamic(src, dst, weight_type=QuantType.QInt8, per_channel=True, op_types_to_quantize=["MatMul"],
                         use_external_data_format=True, extra_options={"MatMulConstBOnly": True})
    finally:
        root.setLevel(level)
    model = onnx.load(str(dst), load_external_data=False)
    if not any(node.op_type == "MatMulInteger" for node in model.graph.node):
        raise QuantizeError(f"{src} has no MatMul with a constant weight to quantize")


def _quantize_graph(src: Path, dst: Path, cfg: QuantConfig) -> None:
    if cfg.scheme == DYNAMIC:
        _quantize_dynamic(src, dst)
        return
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    model = onnx.load(str(src))
    q = MatMulNBitsQuantizer(model, bits=cfg.bits, block_size=cfg.block_size, is_symmetric=cfg.symmetric,
                             accuracy_level=cfg.accuracy_level or None)
    q.process()
    n = sum(node.op_type == "MatMulNBits" for node in q.model.model.graph.node)
    if n == 0:
        raise QuantizeError(f"{src} has no MatMul with a constant weight to quantize")
    dst.parent.mkdir(parents=True, exist_ok=True)
    q.model.save_model_to_file(str(dst), use_external_data_format=True)


def sequence_logits(session: Any, manifest: dict[str, Any], ids: list[int]) -> np.ndarray:
    """Logits ``[T, V]`` of one causal forward of ``ids`` from an empty cache."""
    arch = manifest["architecture"]
    t = len(ids)
    names = input_names(arch["layers"])
    allowed = np.tril(np.ones((t, t), dtype=bool))
    feeds = {"input_ids": np.asarray([ids], np.int64), "position_ids": np.arange(t, dtype=np.int64)[None],
             "attn_mask": np.where(allowed, 0.0, -1e9).astype(np.float32)[None, None]}
    for name in names[3:]:
        feeds[name] = np.zeros((1, arch["kv_heads"], 0, arch["head_dim"]), np.float32)
    return session.run(["logits"], feeds)[0][0]


def agreement(fp32_session: Any, quant_session: Any, manifest: dict[str, Any], prompts: list[list[int]]) -> dict:
    """Top-1 agreement of the quantized graph with fp32 over prompts + greedy continuations."""
    same = total = 0
    max_diff = 0.0
    for prompt in prompts:
        ids = list(prompt)
        for _ in range(CONTINUATION):  # fp32's greedy text: the kind of sequence a draft extends
            ids.append(int(np.argmax(sequence_logits(fp32_session, manifest, ids)[-1])))
        ref = sequence_logits(fp32_session, manifest, ids)[len(prompt) - 1:]
        got = sequence_logits(quant_session, manifest, ids)[len(prompt) - 1:]
        same += int(np.sum(ref.argmax(-1) == got.argmax(-1)))
        total += ref.shape[0]
        max_diff = max(max_diff, float(np.max(np.abs(ref - got))))
    return {"top1_vs_fp32": round(same / total, 4), "positions": total, "prompts": len(prompts),
            "max_abs_diff_vs_fp32": round(max_diff, 4)}


def quantize_export(export_dir: str | Path, cfg: QuantConfig, tokenizer: Any) -> dict[str, Any]:
    """Quantize ``DIR/draft.onnx`` in place (fp32 export in, ``cfg.scheme`` out); return
    the manifest's new ``quantization`` entry. ``tokenizer`` encodes ``HELD_IN_PROMPTS``."""
    out = Path(export_dir)
    manifest = load_manifest(out)
    if manifest["dtype"] != "fp32" or manifest.get("quantization"):
        raise QuantizeError(f"{out} is not a plain fp32 export (dtype {manifest['dtype']}, "
                            f"quantization {manifest.get('quantization')})")
    staging = out / ".quantized"
    shutil.rmtree(staging, ignore_errors=True)
    _quantize_graph(out / ONNX_FILE, staging / ONNX_FILE, cfg)
    prompts = [list(tokenizer(p)["input_ids"]) for p in HELD_IN_PROMPTS]
    stats = agreement(ort_session(out / ONNX_FILE, 1), ort_session(staging / ONNX_FILE, 1), manifest, prompts)
    if stats["top1_vs_fp32"] < MIN_TOP1:
        shutil.rmtree(staging, ignore_errors=True)
        raise QuantizeError(f"{cfg.scheme} draft agrees with fp32 on only {stats['top1_vs_fp32']:.0%} of argmaxes")
    for f in out.glob(ONNX_FILE + "*"):
        f.unlink()
    for f in staging.iterdir():
        f.rename(out / f.name)
    staging.rmdir()
    entry = {**cfg.recorded(), "bits": cfg.bits, "op": cfg.op, **stats}
    manifest["quantization"] = entry
    manifest["files"]["onnx_data"] = ONNX_FILE + ".data" if (out / (ONNX_FILE + ".data")).exists() else None
    write_manifest(out, manifest)
    log.info("quantized %s to %s: top-1 agreement with fp32 %.1f%% over %d positions", out, cfg.scheme,
             100 * stats["top1_vs_fp32"], stats["positions"])
    return entry


def ensure_quantized_export(model: str, out_dir: str | Path, cfg: QuantConfig, progress: bool = True) -> Path:
    """``out_dir`` holding ``model`` exported and quantized with ``cfg``: reused when its manifest
    says so, else built (export + quantize: about two minutes for a 0.5B draft on one core)."""
    from transformers import AutoTokenizer

    out = Path(out_dir).expanduser()
    try:
        m = load_manifest(out)
        q = m.get("quantization") or {}
        if m["model"].get("spec") == model and all(q.get(k) == v for k, v in cfg.recorded().items()):
            return out
    except RapidError:
        pass
    log.info("building the %s draft %s from %s once (export + quantize, ~2 min)", cfg.scheme, out, model)
    export_onnx(model, out, progress=progress)
    quantize_export(out, cfg, AutoTokenizer.from_pretrained(out))
    return out
