"""Build a TensorRT 10 engine from an export folder's ``draft.onnx``.

``build_trt(onnx_path, out_dir, fp16, max_context, max_tree)`` checks the graph's precision
(``rapid.export.trt_precision``), parses it with ``trt.OnnxParser`` into a **strongly typed**
network (external weight files are found next to it), adds two optimisation profiles and writes
``draft.engine`` and ``timing.cache`` into ``out_dir`` (the export folder by default), then
records the build in ``manifest.json`` under ``"trt"``.

Precision follows the graph: the fp16 export (``rapid export --dtype fp16``) gives an FP16
engine whose RMSNorm, RoPE angles and softmax stay fp32 (its explicit Casts are kept, since a
strongly typed network keeps every ONNX type), the fp32 export an FP32 engine. No precision
builder flag is set (strongly typed networks take none) and TF32 is cleared, so fp32 matmuls
are not rounded to a 10-bit mantissa. ``fp16=True`` on an fp32 graph (or ``False`` on an fp16
one) is refused rather than silently building something else.

Profiles (min / opt / max; S = the mask's key axis, P + T at run time; C = max_context,
N = the prefill chunk, ``rapid.core.trt_support.PREFILL_CHUNK`` = 256 by default):

=========  ===================  =====================  ============================
profile    T                    P (past)               S
=========  ===================  =====================  ============================
prefill    1 / min(128,N) / N   0 / 0 / C-1            1 / min(128,N) / C
tree       1 / 8 / max_tree     0 / C/2 / C-1          1 / C/2+8 / C
=========  ===================  =====================  ============================

The prefill profile stops at T = N, not C: the runtime prefills a longer prompt in chunks of N
(``rapid.engines.trt_engine``), so the activations TensorRT reserves scale with N·C instead of
C² (the attention scores of one layer, heads · T · S, at T = C = 2048 are 235 MB in fp32 for
the default draft; at T = 256, 29 MB). The runtime picks the tree profile whenever T ≤
max_tree. A timing cache from an earlier build is reused, which makes rebuilds much faster.
Engines are specific to the GPU and TensorRT version: build on the device that runs them.

Needs ``tensorrt`` (imported lazily: ``import rapid.export.trt_build`` works without it) and
``onnx`` for the precision check; no pycuda.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

from rapid.core.errors import RapidError
from rapid.core.manifest import (
    ENGINE_FILE,
    ONNX_FILE,
    TIMING_CACHE_FILE,
    is_export_dir,
    load_manifest,
    write_manifest,
)
from rapid.core.trt_support import PREFILL_CHUNK, require_tensorrt
from rapid.export.trt_precision import check_onnx_precision

log = logging.getLogger("rapid.export.trt")


class TrtBuildError(RapidError):
    """The TensorRT engine could not be built."""


def profile_shapes(max_context: int, max_tree: int,
                   prefill_chunk: int = PREFILL_CHUNK) -> dict[str, dict[str, tuple[int, int, int]]]:
    """``{profile: {"T": (min, opt, max), "P": …, "S": …}}`` (see the module docstring)."""
    c = int(max_context)
    t_tree = int(max_tree)
    if t_tree < 1 or c < t_tree + 1:
        raise TrtBuildError(f"max_context {c} must exceed max_tree {t_tree} >= 1")
    if prefill_chunk < 1:
        raise TrtBuildError(f"prefill_chunk must be >= 1, got {prefill_chunk}")
    t_pf = min(int(prefill_chunk), c)
    opt_pf = min(128, t_pf)
    opt_tree = min(8, t_tree)
    return {
        "prefill": {"T": (1, opt_pf, t_pf), "P": (0, 0, c - 1), "S": (1, opt_pf, c)},
        "tree": {"T": (1, opt_tree, t_tree), "P": (0, c // 2, c - 1),
                 "S": (1, min(c, c // 2 + opt_tree), c)},
    }


def input_dims(name: str, t: int, p: int, s: int, kv_heads: int, head_dim: int) -> tuple[int, ...]:
    """The shape of input ``name`` at T = t, P = p, S = s."""
    if name in ("input_ids", "position_ids"):
        return (1, t)
    if name == "attn_mask":
        return (1, 1, t, s)
    return (1, kv_heads, p, head_dim)


def _targets(onnx_path: str | Path, out_dir: str | Path | None) -> tuple[Path, Path, dict[str, Any] | None]:
    """(the .onnx file, the output folder, the manifest beside the graph or None)."""
    onnx_path = Path(onnx_path).expanduser()
    if onnx_path.is_dir():
        onnx_path = onnx_path / ONNX_FILE
    if not onnx_path.is_file():
        raise TrtBuildError(f"{onnx_path} does not exist; export the model first (rapid.export.onnx_export)")
    out = Path(out_dir).expanduser() if out_dir is not None else onnx_path.parent
    out.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(onnx_path.parent) if is_export_dir(onnx_path.parent) else None
    return onnx_path, out, manifest


def _precision(onnx_path: Path, fp16: bool | None) -> str:
    """The graph's precision, which the engine keeps; refuses a request for the other one."""
    precision = check_onnx_precision(onnx_path)
    if fp16 is True and precision == "fp32":
        raise TrtBuildError(f"{onnx_path} is an fp32 graph: an FP16 engine builds from the fp16 export "
                            "(`rapid export --dtype fp16`), whose norms, RoPE and softmax are kept fp32")
    if fp16 is False and precision == "fp16":
        raise TrtBuildError(f"{onnx_path} is an fp16 graph: for an FP32 engine export with `--dtype fp32`")
    return precision


def _parse(trt: Any, builder: Any, logger: Any, onnx_path: Path) -> tuple[Any, Any]:
    """A strongly typed network holding the graph (and its parser, which must outlive it)."""
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise TrtBuildError(f"TensorRT's ONNX parser rejected {onnx_path}: " + "; ".join(errors[:5]))
    return network, parser


def _config(trt: Any, builder: Any, network: Any, shapes: dict[str, Any], arch: dict[str, Any] | None,
            workspace_gb: float, cache_path: Path) -> tuple[Any, list[dict[str, Any]]]:
    """Builder config (workspace, no TF32, timing cache) with the optimisation profiles."""
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gb * 1024**3))
    config.clear_flag(trt.BuilderFlag.TF32)
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)
    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    if arch is None:
        k0 = next(x for x in inputs if x.name == "past_key_0")
        kv_heads, head_dim = int(k0.shape[1]), int(k0.shape[3])
    else:
        kv_heads, head_dim = arch["kv_heads"], arch["head_dim"]
    profiles_out = []
    for index, (pname, dims) in enumerate(shapes.items()):
        profile = builder.create_optimization_profile()
        for x in inputs:
            lo, opt, hi = (input_dims(x.name, dims["T"][k], dims["P"][k], dims["S"][k], kv_heads, head_dim)
                           for k in range(3))
            profile.set_shape(x.name, lo, opt, hi)
        if config.add_optimization_profile(profile) < 0:
            raise TrtBuildError(f"TensorRT rejected the {pname} optimisation profile {dims}")
        profiles_out.append({"name": pname, "index": index, **{k: list(v) for k, v in dims.items()}})
    return config, profiles_out


def build_trt(onnx_path: str | Path, out_dir: str | Path | None = None, fp16: bool | None = None,
              max_context: int | None = None, max_tree: int | None = None, *, workspace_gb: float = 2.0,
              prefill_chunk: int = PREFILL_CHUNK, progress: bool = True) -> dict[str, Any]:
    """Build ``draft.engine`` (+ ``timing.cache``); return the ``"trt"`` manifest entry.

    ``fp16``: None = the graph's precision; True / False = insist on it (see the module docstring).
    """
    trt = require_tensorrt()
    onnx_path, out, manifest = _targets(onnx_path, out_dir)
    if max_context is None:
        if manifest is None:
            raise TrtBuildError("max_context is needed when the ONNX file has no manifest beside it")
        max_context = int(manifest["max_context"])
    if max_tree is None:
        max_tree = int(manifest["max_tree"]) if manifest else 64
    shapes = profile_shapes(max_context, max_tree, prefill_chunk)
    t0 = time.perf_counter()
    precision = _precision(onnx_path, fp16)
    logger = trt.Logger(trt.Logger.INFO if progress else trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network, _parser = _parse(trt, builder, logger, onnx_path)
    timings = {"parse": round(time.perf_counter() - t0, 3)}
    cache_path = out / TIMING_CACHE_FILE
    config, profiles = _config(trt, builder, network, shapes, manifest["architecture"] if manifest else None,
                               workspace_gb, cache_path)
    t1 = time.perf_counter()
    log.info("building a strongly typed %s TensorRT engine from %s (max_context %d, max_tree %d, prefill "
             "chunk %d); this takes minutes", precision, onnx_path, max_context, max_tree, shapes["prefill"]["T"][2])
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise TrtBuildError("TensorRT failed to build the engine (see the TensorRT log above)")
    timings["build"] = round(time.perf_counter() - t1, 3)
    engine_path = out / ENGINE_FILE
    engine_path.write_bytes(bytes(serialized))
    cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))
    entry = {
        "engine": ENGINE_FILE, "timing_cache": TIMING_CACHE_FILE, "tensorrt": str(trt.__version__),
        "fp16": precision == "fp16", "precision": precision, "strongly_typed": True, "tf32": False,
        "max_context": int(max_context), "max_tree": int(max_tree), "prefill_chunk": shapes["prefill"]["T"][2],
        "profiles": profiles, "bytes": engine_path.stat().st_size, "timings_s": timings,
    }
    if manifest is not None and out.resolve() == onnx_path.parent.resolve():
        manifest["trt"] = entry
        write_manifest(out, manifest)
    log.info("wrote %s (%.1f MB) in %.0f s", engine_path, entry["bytes"] / 1e6, sum(timings.values()))
    return entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rapid-trt-build", description="Build draft.engine from an export folder")
    ap.add_argument("export_dir", help="folder with draft.onnx and manifest.json (or the .onnx file)")
    ap.add_argument("--out", default=None, help="where to write the engine (default: the export folder)")
    want = ap.add_mutually_exclusive_group()
    want.add_argument("--fp16", dest="fp16", action="store_true", default=None,
                      help="insist on an FP16 engine (the graph must be the fp16 export)")
    want.add_argument("--fp32", dest="fp16", action="store_false",
                      help="insist on an FP32 engine (default: the graph's precision)")
    ap.add_argument("--max-context", type=int, default=None)
    ap.add_argument("--max-tree", type=int, default=None)
    ap.add_argument("--prefill-chunk", type=int, default=PREFILL_CHUNK,
                    help="the prefill profile's max T; longer prompts are prefilled in chunks")
    ap.add_argument("--workspace-gb", type=float, default=2.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        build_trt(args.export_dir, args.out, fp16=args.fp16, max_context=args.max_context,
                  max_tree=args.max_tree, workspace_gb=args.workspace_gb, prefill_chunk=args.prefill_chunk)
    except RapidError as e:
        print(f"{ap.prog}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
