"""``rapid serve``: load the target and run the verifier until interrupted."""

from __future__ import annotations

import asyncio
import logging
import signal

from rapid.core.auth import load_token, server_ssl_context
from rapid.core.device import choose_device
from rapid.core.errors import RapidError
from rapid.core.precision import choose_dtype, cpu_flags
from rapid.core.procs import check_port_free
from rapid.core.vocab import fingerprint
from rapid.engines import rowops
from rapid.modeling import load_decoder
from rapid.models import resolve_model
from rapid.server import row_forward
from rapid.server.app import VerifierServer, serve_forever
from rapid.server.invariance import check_invariance
from rapid.server.serve_config import DEFAULT, ServeConfig, VerifierSpec
from rapid.server.verify_curve import (
    FLAT_TOLERANCE,
    CurvePoint,
    curve_line,
    flat_nodes,
    measure_curve,
    wire_curve,
)

log = logging.getLogger("rapid.server")


def load_target(spec: str, dtype: str = "auto", threads: int = 1, device: str = "auto"):
    """Load the target on ``device`` (``rapid.core.device``: auto = the first CUDA device, else the CPU)
    in ``dtype`` (``rapid.core.precision``: auto = bf16 where native)."""
    import torch

    dev = choose_device(device, torch.cuda.device_count() if torch.cuda.is_available() else 0)
    choice = choose_dtype(dtype, dev, cpu_flags(), row_kernels=rowops.available())
    log.info("target on %s, dtype %s (%s)", dev, choice.dtype, choice.reason)
    torch.set_num_threads(threads)
    model, tokenizer = load_decoder(spec, getattr(torch, choice.dtype))
    model = model.to(dev)
    if row_forward.enabled(model):
        freed = row_forward.release_unpacked(model)
        log.info("weights packed for the row-invariant kernels (%s); %.2f GB of unpacked copies released",
                 rowops.info().isa, freed / 1e9)
    return model, tokenizer


def choose_verify_mode(model, requested: str = "auto", context: int = DEFAULT.max_context) -> str:
    """``tree`` when every row of a tree forward is bitwise a one-token step, else ``sequential``.

    On the row-invariant kernels (``rapid.server.row_forward``: every CPU target in float32 or
    bfloat16) that holds by construction and a cheap probe confirms it; elsewhere
    (``rapid.server.block_forward``: fixed-shape library calls) ``invariance.position_probe``
    checks every block position for every key-slot count up to ``context``. Explicit modes are
    kept (``tree`` on a target found not invariant is logged: outputs may then differ at
    near-ties)."""
    if requested == "sequential":
        return requested
    if not row_forward.enabled(model):
        log.info("checking every block position of the fixed-shape forward up to %d keys", context)
    found = check_invariance(model, context)
    if found.check.invariant:
        log.info("verify mode tree: %s", found.line())
        return "tree"
    if requested == "tree":
        log.warning("tree verification is NOT batch-invariant here (%s, max |dlogit| %.2g): outputs may differ "
                    "from the target alone at near-ties", found.line(), found.check.max_abs_diff)
        return "tree"
    log.warning("tree forwards are not batch-invariant in %s here (%s, max |dlogit| %.2g): verifying "
                "sequentially (exact, one target step per accepted token)", model.dtype, found.line(),
                found.check.max_abs_diff)
    return "sequential"


def startup_curve(model, mode: str) -> list[CurvePoint]:
    """The verify curve measured at start-up (``verify_curve.CURVE_TOKENS``), told to edges in Ready: the
    tree budget (``--budget auto``) and the cost-aware depth policy follow it; [] in sequential mode
    (no tree forward)."""
    if mode != "tree":
        return []
    points = measure_curve(model)
    log.info("verify curve %s: flat (<= %.1fx a step) up to %d tree nodes", curve_line(points), FLAT_TOLERANCE,
             flat_nodes(points))
    return points


def measured_flat_nodes(model, mode: str, points: list[CurvePoint] | None = None) -> int:
    """Tree nodes verified at about one step's cost (``verify_curve.flat_nodes``) of ``points`` (default:
    measured now by ``startup_curve``); 0 without a curve."""
    points = startup_curve(model, mode) if points is None else points
    return flat_nodes(points) if points else 0


def build_verifier(spec: VerifierSpec, token: str | None = None) -> VerifierServer:
    """Load the target, measure its verify mode and curve, and wrap it in a ``VerifierServer``
    (the single-process server and every Ray Serve replica are built here)."""
    target = resolve_model(spec.target)  # a bad --target: its one-line error before any other line
    log.info("loading target %s (%s, %d thread(s))", spec.target, spec.dtype, spec.threads)
    model, tokenizer = load_target(target, spec.dtype, spec.threads, spec.device)
    mode = choose_verify_mode(model, spec.verify, spec.limits.max_context)
    points = startup_curve(model, mode)
    return VerifierServer(model, spec.limits, token=token, batch_window_ms=spec.batch_window_ms,
                          max_batch=spec.max_batch, verify_mode=mode, flat_nodes=measured_flat_nodes(model, mode, points),
                          tokenizer=fingerprint(tokenizer), curve=wire_curve(points))


def run_serve(config: ServeConfig) -> int:
    """``rapid serve``: the verifier on ``config.host:port`` until SIGINT/SIGTERM."""
    try:
        spec = config.verifier()
    except ValueError as e:
        raise RapidError(str(e)) from None
    token = load_token(config.token_file)
    ssl_ctx = server_ssl_context(config.cert, config.key)
    check_port_free(config.host, config.port)
    server = build_verifier(spec, token)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve_forever(server, config.host, config.port, stop=stop, ssl=ssl_ctx)
        log.info("verifier stopped: %s", server.stats)

    asyncio.run(main())
    return 0
