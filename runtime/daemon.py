"""``rapid edge``: the long-lived edge runtime with an OpenAI-compatible local HTTP API.

    rapid edge --draft MODEL | --engine EXPORT_DIR --cloud wss://HOST:PORT --token-file F \\
               [--listen 127.0.0.1:8000] [--policy rapid] [--parallel 2]

Endpoints (FastAPI + uvicorn): ``POST /v1/completions``, ``POST /v1/chat/completions`` (chat
template from the tokenizer; ``stream: true`` → server-sent events ending in ``data: [DONE]``;
what is honoured and what is refused: ``rapid.runtime.openai_schema``), ``GET /v1/models``,
``GET /health`` (503 while the cloud does not answer), ``GET /livez``, ``GET /metrics``
(Prometheus text). ``--api-key`` (else ``$RAPID_API_KEY``) requires ``Authorization: Bearer KEY``
on ``/v1/*``; the three probes stay open. ``--max-tokens``, ``--temperature``, ``--top-p``, ``--top-k`` and ``--seed``
are the defaults of requests that leave them out. Clean shutdown on SIGTERM/SIGINT (uvicorn's handlers: stop
accepting, finish in-flight requests up to ``--shutdown-timeout``).

Concurrency: a draft engine holds one sequence's KV, so it serves one request at a time. The
daemon opens ``--parallel`` engines (one copy of the weights, a KV cache each) and hands them out first come,
first served; further requests wait in FIFO order (fair). Each request has its own cloud session
(its own ``CloudLink``, with reconnect/resume). A request whose client goes away is abandoned at
the next round boundary: its link says ``Bye`` (the cloud frees the session's KV at once) and its
engine goes back to the pool.

Exactness: the tokens equal target-only decoding; with ``temperature > 0`` and no ``seed`` the
daemon draws a random seed per request (OpenAI semantics: not reproducible unless seeded).
"""

# Layout: this module is the CLI and server wiring; the engine pool and generation are in
# engine_pool.py, the HTTP endpoints in openai_api.py, the Prometheus metrics in edge_metrics.py.

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal

from rapid.core.auth import client_ssl_context, load_token
from rapid.core.errors import OptionError, RapidError
from rapid.core.procs import check_port_free
from rapid.runtime.edge_config import BACKENDS, DEFAULT, EdgeConfig, HelpFormatter, add_edge_args
from rapid.runtime.engine_pool import EdgeService
from rapid.runtime.generate import open_edge_models
from rapid.runtime.link import checked_seconds
from rapid.runtime.openai_api import create_app
from rapid.runtime.openai_schema import RequestDefaults
from rapid.runtime.tree import TreeParams

log = logging.getLogger("rapid.edge.daemon")


def _server_class():
    import uvicorn  # optional: only the daemon needs it

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGTERM after its graceful shutdown (exit status -15); a service
        that shut down cleanly should exit 0, so handle the signals here and return."""

        @contextlib.contextmanager
        def capture_signals(self):
            previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in previous.items():
                    signal.signal(s, h)

    return Server


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rapid edge", description=__doc__, formatter_class=HelpFormatter)
    add_edge_args(ap, exclude=("engine",))  # rapid.runtime.edge_config: draft, cloud, tree, sampling
    ap.add_argument("--engine", "--backend", dest="engine", default=DEFAULT.engine,
                    help="draft backend: auto|torch|onnx|trt (an export folder here is read as --draft, deprecated)")
    ap.add_argument("--host", default=None, help="address of the local OpenAI-compatible API (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=None, help="port of the local API (default 8000)")
    ap.add_argument("--listen", default=None, help="HOST:PORT, the older spelling of --host/--port")
    ap.add_argument("--parallel", type=int, default=2, help="draft engines = requests generated at once")
    ap.add_argument("--api-key", default=None,
                    help="require Authorization: Bearer KEY on /v1/* (default: $RAPID_API_KEY, else open); "
                         "/health, /livez, /metrics stay open")
    ap.add_argument("--model-name", help="model id reported by /v1/models (default: the draft's name)")
    ap.add_argument("--retry-timeout", type=float, default=30.0, help="silence before the link re-sends/reconnects")
    ap.add_argument("--verdict-timeout", type=float, default=120.0,
                    help="hard cap on one round's wait for the cloud, re-sends and reconnects included "
                         "(the deadline is 10x the slowest round so far, at least 30 s, at most this)")
    ap.add_argument("--shutdown-timeout", type=float, default=10.0, help="seconds to finish requests on SIGTERM")
    # the sampling flags are the defaults of requests that leave them out; unset: OpenAI's
    # (temperature 1, top_p 1, a random seed when sampling, max_tokens until EOS / context)
    ap.set_defaults(max_tokens=None, temperature=None, top_p=None, top_k=None, seed=None)
    return ap


def request_defaults(args: argparse.Namespace) -> RequestDefaults:
    """The daemon's sampling flags as the defaults of its requests."""
    return RequestDefaults(args.max_tokens, 1.0 if args.temperature is None else args.temperature,
                           1.0 if args.top_p is None else args.top_p, args.top_k or 0, args.seed)


def api_key_of(args: argparse.Namespace) -> str | None:
    """The local API's key: ``--api-key``, else ``$RAPID_API_KEY``, else None (no key needed)."""
    return args.api_key or os.environ.get("RAPID_API_KEY") or None


def _source_and_backend(args: argparse.Namespace) -> tuple[str, str]:
    """(draft, backend); ``--engine EXPORT_DIR`` (the old meaning) still works, with a warning."""
    if args.engine not in BACKENDS:
        if not os.path.isdir(args.engine):
            raise RapidError(f"--engine {args.engine!r}: choose from {', '.join(BACKENDS)} (the draft goes in --draft)")
        log.warning("--engine EXPORT_DIR is deprecated: pass the folder as --draft (--engine is the backend)")
        return args.engine, "auto"
    return args.draft, args.engine


def _listen_address(args: argparse.Namespace) -> tuple[str, int]:
    host, port = "127.0.0.1", 8000
    if args.listen:
        h, _, p = args.listen.rpartition(":")
        if not h or not p.isdigit():
            raise RapidError(f"--listen wants HOST:PORT, got {args.listen!r}")
        host, port = h, int(p)
    host = args.host or host
    port = args.port if args.port is not None else port
    if not 1 <= port <= 65535:  # 0 too: uvicorn would pick a port no one is told
        raise OptionError(f"{'--port' if args.port is not None else '--listen'} must name a port in [1, 65535], "
                          f"got {port}")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host  # [::1]:8000
    check_port_free(host, port)  # a busy port or a host not here: one line before the engines load
    return host, port


def _checked_options(args: argparse.Namespace) -> TreeParams:
    """The daemon's own flags and the edge options (``EdgeConfig``), one line each before any model
    loads (a bad ``--verdict-timeout`` used to surface as a traceback at the first request); the
    tree parameters of its requests."""
    if args.parallel < 1:
        raise OptionError(f"--parallel must be >= 1, got {args.parallel}")
    checked_seconds("--retry-timeout", args.retry_timeout)
    checked_seconds("--verdict-timeout", args.verdict_timeout)
    checked_seconds("--shutdown-timeout", args.shutdown_timeout, zero_ok=True)
    return EdgeConfig.of(args).tree()


def main(argv: list[str] | None = None) -> int:
    import uvicorn  # optional: only the daemon needs it

    _Server = _server_class()
    args = build_parser().parse_args(argv)
    source, backend = _source_and_backend(args)
    host, port = _listen_address(args)
    tree = _checked_options(args)
    token = load_token(args.token_file)
    if token is None:
        log.warning("no --token-file / RAPID_TOKEN: connecting to the cloud without a token")
    ssl = client_ssl_context(args.cloud, args.cafile)
    edges = open_edge_models(source, backend, args.capacity, args.threads, args.parallel)
    service = EdgeService(edges, args.cloud, policy=args.policy, tree=tree,
                          token=token, ssl=ssl, model_name=args.model_name or os.path.basename(source.rstrip("/")),
                          link_options={"retry_timeout": args.retry_timeout,
                                        "verdict_timeout_s": args.verdict_timeout})
    api_key = api_key_of(args)
    if api_key is None and host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("the API on %s:%s needs no key (no --api-key / RAPID_API_KEY)", host, port)
    config = uvicorn.Config(create_app(service, request_defaults(args), api_key), host=host, port=int(port), log_level="info",
                            log_config=None,  # uvicorn logs through the CLI's handler and format
                            timeout_graceful_shutdown=args.shutdown_timeout, access_log=False)
    server = _Server(config)
    log.info("rapid edge: %s engine(s) of %s, cloud %s, API on http://%s:%s/v1", len(edges), source, args.cloud, host, port)
    try:
        server.run()  # returns after SIGTERM / SIGINT once in-flight requests finish
    finally:
        service.close()
    log.info("rapid edge stopped")
    return 0
