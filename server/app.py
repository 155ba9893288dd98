"""The cloud verifier's websocket server.

One connection carries one session: ``Hello`` (prefill the prompt) → ``Ready``, then any number
of ``Tree`` → ``VerdictFrame``. Model work runs on one worker thread so the event loop keeps
serving other connections. Anything wrong with a frame or a tree is answered with an
``ErrorFrame`` carrying a reason; the connection stays usable and other sessions are untouched.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import websockets
from websockets.asyncio.server import ServerConnection, serve

from rapid.errors import RapidError
from rapid.modeling import Decoder
from rapid.sampling import SamplingParams
from rapid.server.sessions import Limits, SessionTable
from rapid.server.target import TargetSession
from rapid.wire import (
    MAX_FRAME_BYTES,
    Bye,
    ErrorFrame,
    Hello,
    Ready,
    Tree,
    VerdictFrame,
    WireError,
    decode,
    encode,
)

log = logging.getLogger("rapid.server")


class VerifierServer:
    def __init__(self, model: Decoder, limits: Limits | None = None,
                 answer_delay: Callable[[], float] | None = None) -> None:
        self.model = model
        self.answer_delay = answer_delay  # seconds to hold each verdict (transport-delay emulation)
        self.limits = limits or Limits()
        self.sessions = SessionTable(self.limits)
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rapid-verify")
        self.stats = {"connections": 0, "rounds": 0, "errors": 0}

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def handle(self, ws: ServerConnection) -> None:
        self.stats["connections"] += 1
        sid: str | None = None
        try:
            async for message in ws:
                reply, sid = await self._on_message(message, sid)
                if reply is None:
                    break
                await ws.send(encode(reply))
        except websockets.ConnectionClosed:
            pass
        finally:
            self.sessions.drop(sid)

    async def _on_message(self, message, sid):
        """Return (reply frame or None to close, session id)."""
        try:
            frame = decode(message)
        except WireError as e:
            self.stats["errors"] += 1
            return ErrorFrame(e.code, e.reason), sid
        if isinstance(frame, Bye):
            return None, sid
        if isinstance(frame, Hello):
            return await self._hello(frame, sid)
        if isinstance(frame, Tree):
            session = self.sessions.get(sid) if sid else None
            if session is None:
                return ErrorFrame("no_session", "send a hello frame before trees", frame.round), sid
            return await self._verify(session, frame), sid
        return ErrorFrame("unexpected", f"a client may not send {frame.T} frames"), sid

    async def _hello(self, h: Hello, sid):
        if sid is not None:
            return ErrorFrame("bad_state", "this connection already has a session"), sid
        if self.sessions.full:
            return ErrorFrame("busy", f"the server is at its limit of {self.limits.max_sessions} sessions; retry later"), sid
        try:
            params = SamplingParams(h.temperature, h.top_p, h.top_k, h.seed)
            max_nodes = min(h.max_nodes, self.limits.max_nodes)
            session = await self._run(
                lambda: TargetSession(self.model, h.prompt, params, self.limits.max_context, max_nodes))
        except (ValueError, RapidError) as e:
            self.stats["errors"] += 1
            code = "context" if "context" in str(e) else "bad_hello"
            return ErrorFrame(code, str(e)), sid
        sid = self.sessions.add(session)
        log.info("session %s: prompt of %d tokens", sid, len(h.prompt))
        return Ready(sid, self.model.config.vocab_size, session.capacity, max_nodes, len(session.tokens)), sid

    async def _verify(self, session: TargetSession, t: Tree):
        t0 = time.perf_counter()
        try:
            verdict = await self._run(session.verify, t.tokens, t.parents)
        except RapidError as e:
            self.stats["errors"] += 1
            return ErrorFrame("bad_tree", str(e), t.round)
        except Exception as e:  # a crash in one session's verification stays in that session
            log.exception("verification failed")
            self.stats["errors"] += 1
            return ErrorFrame("internal", f"verification failed: {type(e).__name__}", t.round)
        self.stats["rounds"] += 1
        if self.answer_delay is not None:
            await asyncio.sleep(self.answer_delay())
        return VerdictFrame(t.round, list(verdict.path), verdict.bonus, len(session.tokens),
                            time.perf_counter() - t0)


async def serve_forever(server: VerifierServer, host: str, port: int,
                        ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> None:
    async with serve(server.handle, host, port, max_size=MAX_FRAME_BYTES, compression=None) as ws_server:
        addr = ws_server.sockets[0].getsockname()
        log.info("verifier listening on ws://%s:%d", addr[0], addr[1])
        server.port = addr[1]
        if ready is not None:
            ready.set()
        await (stop.wait() if stop is not None else asyncio.Future())
