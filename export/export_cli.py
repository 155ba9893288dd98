"""Command line of the ONNX export: ``rapid export`` and ``python -m rapid.export.export_cli``."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from rapid.core.errors import OptionError, RapidError
from rapid.core.manifest import ONNX_FILE
from rapid.core.optional import import_optional
from rapid.core.trt_support import TrtUnavailableError, require_tensorrt
from rapid.export.onnx_export import export_onnx
from rapid.export.quantize import DYNAMIC, SCHEMES, QuantConfig, QuantizeError, quantize_export


def load_export_tokenizer(out: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(out)


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("model", nargs="?", default=argparse.SUPPRESS,
                        help="HF id, local folder, .gguf file or default-draft (the default)")
    parser.add_argument("--model", dest="model_option", default=argparse.SUPPRESS, metavar="MODEL",
                        help="the same as MODEL")
    parser.add_argument("--out", "-o", required=True, help="export folder (draft.onnx, manifest.json, tokenizer)")
    parser.add_argument("--dtype", choices=("fp32", "fp16"), default="fp32")
    parser.add_argument("--max-context", type=int, default=2048, help="most KV entries a step may see (P+T)")
    parser.add_argument("--max-tree", type=int, default=64, help="most tokens of one tree step")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default: the exporter's)")
    parser.add_argument("--trt", action="store_true",
                        help="also build draft.engine with TensorRT (strongly typed, in the --dtype precision)")
    add_quantize_arguments(parser)
    parser.add_argument("--no-progress", action="store_true")
    return parser


def add_quantize_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quantize", choices=sorted(SCHEMES), default=None,
                        help="int4/int8: weight-only MatMulNBits (int4: fastest CPU draft); int8-dynamic: int8 weights and "
                             "activations (flat step curve on AMX); parity vs fp32 goes in the manifest")
    parser.add_argument("--quant-block", type=int, default=None,
                        help="input channels per quantization scale, int4/int8 only (default 128)")


def _quant_config(args: argparse.Namespace) -> QuantConfig | None:
    """``--quantize``'s config, or None; refuses combinations it cannot honour before any work."""
    scheme = getattr(args, "quantize", None)
    block = getattr(args, "quant_block", None)
    if scheme is None:
        if block is not None:
            raise OptionError("--quant-block needs --quantize int4 or int8 (it sets their block size): "
                              "add --quantize, or drop --quant-block")
        return None
    if args.dtype != "fp32":
        raise QuantizeError("--quantize starts from the fp32 graph: drop --dtype fp16")
    if getattr(args, "trt", False):
        raise QuantizeError("--quantize makes an ONNX Runtime graph (MatMulNBits, MatMulInteger); TensorRT builds from "
                            "the fp32/fp16 export: use one of --quantize and --trt")
    if scheme == DYNAMIC and block is not None:
        raise QuantizeError("int8-dynamic scales each output channel, not blocks of inputs: drop --quant-block")
    return QuantConfig(scheme) if block is None else QuantConfig(scheme, block)


def _require_tensorrt() -> None:
    """``--trt``'s TensorRT, looked for before the ONNX export (minutes), not after it."""
    try:
        require_tensorrt()  # imports tensorrt only now
    except TrtUnavailableError as e:
        raise TrtUnavailableError(f"--trt: {e}; or drop --trt to export ONNX only") from e


def export_model(args: argparse.Namespace) -> str:
    """The model to export: ``MODEL`` or ``--model`` (one of them; default-draft without either)."""
    given, option = getattr(args, "model", None), getattr(args, "model_option", None)
    if any(m is not None and not m.strip() for m in (given, option)):
        raise OptionError("the model must be named (an HF id, a folder, a .gguf file or default-draft), got an empty string")
    if given is not None and option is not None and given != option:
        raise OptionError(f"the model is named twice, {given!r} and --model {option!r}: give one")
    return given or option or "default-draft"


def check_args(args: argparse.Namespace) -> QuantConfig | None:
    """Refuse what the export cannot honour before any model loads; return ``--quantize``'s config."""
    export_model(args)
    if not str(args.out).strip():
        raise OptionError("--out must name the export folder, got an empty string")
    quant = _quant_config(args)
    if getattr(args, "trt", False):
        _require_tensorrt()
    return quant


def _report_export(out: Path, m: dict) -> None:
    par = m["parity"]
    print(f"wrote {out / ONNX_FILE} ({m['dtype']}, opset {m['exporter']['opset']}) in "
          f"{m['timings_s']['total']:.1f} s")
    for name, case in par["cases"].items():
        print(f"  parity {name:7s} T={case['T']:<2d} P={case['P']:<2d} max|Δlogit|={case['max_abs_diff']:.3g} "
              f"(bound {case['bound']:.3g}) top1={case['top1_agree']:.2f}")


def _quantize(out: Path, quant: QuantConfig) -> None:
    print(f"quantizing to {quant.scheme}, then checking it against fp32 (a 0.5B draft: 1-3 min) ...", flush=True)
    q = quantize_export(out, quant, load_export_tokenizer(out))
    how = ("per output channel, activations per step" if q["op"] == "MatMulInteger"
           else f"block {q['block_size']}, accuracy level {q['accuracy_level']}")
    print(f"quantized to {q['scheme']} ({how}): "
          f"top-1 agreement with fp32 {q['top1_vs_fp32']:.1%} over {q['positions']} positions, "
          f"max|Δlogit| {q['max_abs_diff_vs_fp32']:.3g}")


def run_from_args(args: argparse.Namespace) -> int:
    """Run an export from parsed arguments (``rapid export`` or :func:`main`); returns the exit code.

    Reads ``model`` / ``model_option`` (``MODEL`` / ``--model``), ``out``, ``dtype``,
    ``max_context``, ``max_tree`` and, when present, ``opset``, ``trt``, ``quantize``,
    ``quant_block`` and ``no_progress``. Bad options and failed steps raise :class:`RapidError`; the caller prints it as one line
    (``rapid export: error: ...`` from rapid/cli.py).
    """
    quant = check_args(args)
    out = Path(args.out)
    m = export_onnx(export_model(args), out, dtype=args.dtype, max_context=args.max_context,
                    max_tree=args.max_tree, progress=not getattr(args, "no_progress", False),
                    opset=getattr(args, "opset", None))
    _report_export(out, m)
    if quant is not None:
        _quantize(out, quant)
    if getattr(args, "trt", False):
        trt_build = import_optional("rapid.export.trt_build", "tensorrt")
        entry = trt_build.build_trt(out / ONNX_FILE, out, fp16=args.dtype == "fp16",
                                    max_context=args.max_context, max_tree=args.max_tree)
        print(f"wrote {out / entry['engine']} (TensorRT {entry['tensorrt']}, profiles "
              f"{', '.join(p['name'] for p in entry['profiles'])})")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = add_arguments(argparse.ArgumentParser(prog="rapid-export-onnx", description=__doc__.split("\n")[0]))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return run_from_args(args)
    except RapidError as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
