"""Build a TensorRT 10 engine from an export folder's ``draft.onnx``.

``build_trt(onnx_path, out_dir, fp16, max_context, max_tree)`` parses the ONNX graph with
``trt.OnnxParser`` (external weight files are found next to it), adds two optimisation profiles
and writes ``draft.engine`` and ``timing.cache`` into ``out_dir`` (the export folder by
default), then records the build in ``manifest.json`` under ``"trt"``.

Profiles (min / opt / max; S = the mask's key axis, P + T at run time):

=========  ===================  =====================  ============================
profile    T                    P (past)               S
=========  ===================  =====================  ============================
prefill    1 / 128 / C          0 / 0 / C-1            1 / 128 / C
tree       1 / 8 / max_tree     0 / C/2 / C-1          1 / C/2+8 / C
=========  ===================  =====================  ============================

with C = max_context. The runtime (``rapid.engines.trt_engine``) picks the tree profile
whenever T ≤ max_tree. A timing cache from an earlier build is reused, which makes rebuilds
(e.g. after changing max_context) much faster. Engines are specific to the GPU and TensorRT
version: build on the device that runs them (the Jetson itself).

Needs ``tensorrt`` only (no pycuda). Imported lazily: ``import rapid.export.trt_build`` works
without it.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

from rapid.errors import RapidError
from rapid.manifest import (
    ENGINE_FILE,
    ONNX_FILE,
    TIMING_CACHE_FILE,
    is_export_dir,
    load_manifest,
    write_manifest,
)
from rapid.trt_support import require_tensorrt

log = logging.getLogger("rapid.export.trt")


class TrtBuildError(RapidError):
    """The TensorRT engine could not be built."""


def profile_shapes(max_context: int, max_tree: int) -> dict[str, dict[str, tuple[int, int, int]]]:
    """``{profile: {"T": (min, opt, max), "P": …, "S": …}}`` (see the module docstring)."""
    c = int(max_context)
    t_tree = int(max_tree)
    if t_tree < 1 or c < t_tree + 1:
        raise TrtBuildError(f"max_context {c} must exceed max_tree {t_tree} >= 1")
    opt_pf = min(128, c)
    opt_tree = min(8, t_tree)
    return {
        "prefill": {"T": (1, opt_pf, c), "P": (0, 0, c - 1), "S": (1, opt_pf, c)},
        "tree": {"T": (1, opt_tree, t_tree), "P": (0, c // 2, c - 1),
                 "S": (1, min(c, c // 2 + opt_tree), c)},
    }


def _input_dims(name: str, t: int, p: int, s: int, kv_heads: int, head_dim: int) -> tuple[int, ...]:
    if name in ("input_ids", "position_ids"):
        return (1, t)
    if name == "attn_mask":
        return (1, 1, t, s)
    return (1, kv_heads, p, head_dim)


def build_trt(onnx_path: str | Path, out_dir: str | Path | None = None, fp16: bool = True,
              max_context: int | None = None, max_tree: int | None = None, *, workspace_gb: float = 2.0,
              progress: bool = True) -> dict[str, Any]:
    """Build ``draft.engine`` (+ ``timing.cache``); return the ``"trt"`` manifest entry."""
    trt = require_tensorrt()
    onnx_path = Path(onnx_path).expanduser()
    if onnx_path.is_dir():
        onnx_path = onnx_path / ONNX_FILE
    if not onnx_path.is_file():
        raise TrtBuildError(f"{onnx_path} does not exist; export the model first (rapid.export.onnx_export)")
    out = Path(out_dir).expanduser() if out_dir is not None else onnx_path.parent
    out.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(onnx_path.parent) if is_export_dir(onnx_path.parent) else None
    arch = manifest["architecture"] if manifest else None
    if max_context is None:
        if manifest is None:
            raise TrtBuildError("max_context is needed when the ONNX file has no manifest beside it")
        max_context = int(manifest["max_context"])
    if max_tree is None:
        max_tree = int(manifest["max_tree"]) if manifest else 64
    shapes = profile_shapes(max_context, max_tree)
    timings: dict[str, float] = {}

    t0 = time.perf_counter()
    logger = trt.Logger(trt.Logger.INFO if progress else trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch is the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise TrtBuildError(f"TensorRT's ONNX parser rejected {onnx_path}: " + "; ".join(errors[:5]))
    timings["parse"] = round(time.perf_counter() - t0, 3)

    inputs = [network.get_input(i) for i in range(network.num_inputs)]
    if arch is None:
        k0 = next(x for x in inputs if x.name == "past_key_0")
        kv_heads, head_dim = int(k0.shape[1]), int(k0.shape[3])
    else:
        kv_heads, head_dim = arch["kv_heads"], arch["head_dim"]

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(workspace_gb * 1024**3))
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    cache_path = out / TIMING_CACHE_FILE
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)

    profiles_out = []
    for index, (pname, dims) in enumerate(shapes.items()):
        profile = builder.create_optimization_profile()
        for x in inputs:
            lo, opt, hi = (_input_dims(x.name, dims["T"][k], dims["P"][k], dims["S"][k], kv_heads, head_dim)
                           for k in range(3))
            profile.set_shape(x.name, lo, opt, hi)
        got = config.add_optimization_profile(profile)
        if got < 0:
            raise TrtBuildError(f"TensorRT rejected the {pname} optimisation profile {dims}")
        profiles_out.append({"name": pname, "index": index, **{k: list(v) for k, v in dims.items()}})

    t1 = time.perf_counter()
    log.info("building TensorRT engine from %s (%s, max_context %d, max_tree %d); this takes minutes",
             onnx_path, "fp16" if fp16 else "fp32", max_context, max_tree)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise TrtBuildError("TensorRT failed to build the engine (see the TensorRT log above)")
    timings["build"] = round(time.perf_counter() - t1, 3)
    engine_path = out / ENGINE_FILE
    engine_path.write_bytes(bytes(serialized))
    cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))

    entry = {
        "engine": ENGINE_FILE,
        "timing_cache": TIMING_CACHE_FILE,
        "tensorrt": str(trt.__version__),
        "fp16": bool(fp16),
        "max_context": int(max_context),
        "max_tree": int(max_tree),
        "profiles": profiles_out,
        "bytes": engine_path.stat().st_size,
        "timings_s": timings,
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
    ap.add_argument("--fp32", action="store_true", help="do not enable FP16 kernels")
    ap.add_argument("--max-context", type=int, default=None)
    ap.add_argument("--max-tree", type=int, default=None)
    ap.add_argument("--workspace-gb", type=float, default=2.0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        build_trt(args.export_dir, args.out, fp16=not args.fp32, max_context=args.max_context,
                  max_tree=args.max_tree, workspace_gb=args.workspace_gb)
    except RapidError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
