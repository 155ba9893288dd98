"""``rapid serve``: load the target and run the verifier until interrupted."""

from __future__ import annotations

import asyncio
import logging
import signal

from rapid.auth import load_token, server_ssl_context
from rapid.server.app import VerifierServer, serve_forever
from rapid.server.sessions import Limits

log = logging.getLogger("rapid.server")


def load_target(spec: str, dtype: str = "float32", threads: int = 1):
    import torch

    from rapid.modeling import load_decoder

    torch.set_num_threads(threads)
    model, tokenizer = load_decoder(spec, getattr(torch, dtype))
    return model, tokenizer


def run_serve(target: str, host: str, port: int, threads: int = 1, dtype: str = "float32",
              max_sessions: int = 16, max_context: int = 4096, max_nodes: int = 64, *,
              token_file: str | None = None, cert: str | None = None, key: str | None = None,
              batch_window_ms: float = 2.0, max_batch: int = 8, idle_timeout: float = 600.0,
              grace: float = 30.0) -> int:
    token = load_token(token_file)
    ssl_ctx = server_ssl_context(cert, key)
    log.info("loading target %s (%s, %d thread(s))", target, dtype, threads)
    model, _ = load_target(target, dtype, threads)
    server = VerifierServer(model, Limits(max_sessions, max_context, max_nodes, grace, idle_timeout), token=token,
                            batch_window_ms=batch_window_ms, max_batch=max_batch)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve_forever(server, host, port, stop=stop, ssl=ssl_ctx)
        log.info("verifier stopped: %s", server.stats)

    asyncio.run(main())
    return 0
