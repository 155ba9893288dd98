"""The cloud verifier's websocket server.

A connection drives one session: ``Hello`` (prefill the prompt) → ``Ready``, then any number of
``Tree`` → ``VerdictFrame``. Model work runs on one worker thread so the event loop keeps serving
other connections; with ``max_batch > 1`` trees of different sessions that arrive within
``batch_window_s`` share one target forward (``rapid.server.batching``). Anything wrong with a
frame or a tree is answered with an ``ErrorFrame`` carrying a reason; the connection stays
usable and other sessions are untouched.

Connections: at most ``limits.max_connections`` are open at once (beyond it the upgrade is
answered HTTP 503, ``rapid.server.connections``). A connection must hold a session within
``limits.hello_timeout_s`` of connecting, or it gets ``ErrorFrame("timeout")`` and is closed.
The server also closes, after an error frame, a connection whose session it took away: reaped
after ``limits.idle_timeout_s`` without a frame (``timeout``) or resumed on another connection
(``no_session``). Every open connection thus holds a live session or has a deadline.

Security: with a token configured, the HTTP upgrade must carry ``Authorization: Bearer <token>``
or it is answered 401 before any frame is read (``rapid.core.auth``). ``GET /health`` is open,
``GET /metrics`` (Prometheus text) needs the token too. TLS is the ``ssl`` context given to
``serve_forever``.

Fault tolerance: a connection that drops without ``Bye`` leaves its session *detached* for
``limits.grace_s``; ``Hello(session=id, prompt=committed tokens)`` on a new connection resumes it
(``Ready.committed`` may then be ahead of the edge by one verdict that was lost in flight: the
edge re-sends that tree and gets the stored verdict, never a second verification). An unknown or
mismatched session id is re-established by prefilling the committed tokens (a restarted cloud).
"""

from __future__ import annotations

import asyncio
import http
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import websockets
from websockets.asyncio.server import ServerConnection, serve
from websockets.protocol import State

from rapid.core.auth import check_authorization_headers
from rapid.core.errors import RapidError
from rapid.core.sampling import SamplingParams
from rapid.core.wire import (
    TRANSPORT_MAX_BYTES,
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
from rapid.modeling import Decoder
from rapid.server.batching import Batcher
from rapid.server.connections import ConnectionGate
from rapid.server.metrics import ServerMetrics
from rapid.server.serve_config import Limits
from rapid.server.sessions import Entry, SessionTable
from rapid.server.target import PromptTooLongError, TargetSession

log = logging.getLogger("rapid.server")
CLOSE_S = 5.0  # a server-initiated close (error frame + closing handshake) takes at most this long


def _peer(connection: ServerConnection) -> str:
    addr = connection.remote_address
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) and len(addr) >= 2 else str(addr)


class VerifierServer:
    def __init__(self, model: Decoder, limits: Limits | None = None,
                 answer_delay: Callable[[], float] | None = None, *, token: str | None = None,
                 batch_window_ms: float = 0.0, max_batch: int = 1, verify_mode: str = "tree",
                 flat_nodes: int = 0, tokenizer: str = "",
                 curve: tuple[list[int], list[int]] = ([], [])) -> None:
        self.model = model
        self.tokenizer = tokenizer  # rapid.core.vocab.fingerprint of the target's tokenizer ("" = unchecked)
        self.flat_nodes = flat_nodes  # told to edges in Ready (server.verify_curve.flat_nodes)
        self.curve = (list(curve[0]), list(curve[1]))  # Ready's curve_nodes / curve_us (verify_curve.wire_curve)
        self.verify_mode = verify_mode  # "tree" or "sequential" (rapid.server.target)
        self.answer_delay = answer_delay  # seconds to hold each verdict and Ready (transport-delay emulation)
        self.limits = limits or Limits()
        self.sessions = SessionTable(self.limits)
        self.gate = ConnectionGate(self.limits.max_connections)
        self._closers: set[asyncio.Task] = set()  # connections being closed by the server
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rapid-verify")
        self.token = token
        self.metrics = ServerMetrics()
        self.batcher = (Batcher(self.pool, batch_window_ms / 1000.0, max_batch, self._on_batch, self._on_split)
                        if max_batch > 1 else None)
        self.stats = {"connections": 0, "rounds": 0, "errors": 0, "replayed": 0, "resumed": 0}
        self.port: int | None = None
        if token is None:
            log.warning("verifier runs WITHOUT authentication (no --token-file / RAPID_TOKEN): local use only")

    # -- HTTP side of the handshake ------------------------------------------------------------

    def process_request(self, connection: ServerConnection, request):
        path = request.path.split("?", 1)[0]
        if path == "/health":
            return connection.respond(http.HTTPStatus.OK, "ok\n")
        if not check_authorization_headers(request.headers.get_all("Authorization"), self.token):
            self.metrics.auth_failures.inc()
            log.warning("refused %s from %s: missing or wrong bearer token (HTTP 401)", path,
                        _peer(connection))
            return connection.respond(http.HTTPStatus.UNAUTHORIZED, "missing or wrong bearer token\n")
        if path == "/metrics":
            self._refresh_gauges()
            resp = connection.respond(http.HTTPStatus.OK, self.metrics.render().decode())
            resp.headers["Content-Type"] = "text/plain; version=0.0.4; charset=utf-8"
            return resp
        if not self.gate.admit(connection):
            self.metrics.connections_refused.inc()
            log.warning("refused a connection from %s: at the limit of %d open connections (HTTP 503)",
                        _peer(connection), self.gate.cap)
            resp = connection.respond(http.HTTPStatus.SERVICE_UNAVAILABLE,
                                      f"the verifier is at its limit of {self.gate.cap} connections; retry later\n")
            resp.headers["Retry-After"] = "1"
            return resp
        return None

    def _refresh_gauges(self) -> None:
        self.metrics.sessions_active.set(len(self.sessions))
        self.metrics.sessions_detached.set(self.sessions.detached)
        self.metrics.connections_open.set(self.gate.open)

    def _on_batch(self, size: int, seconds: float) -> None:
        self.metrics.batch_size.observe(size)
        self.metrics.forward_latency.observe(seconds)

    def _on_split(self, size: int, error: Exception) -> None:
        self.metrics.batch_failures.inc()
        log.error("batched forward of %d trees failed (%s: %s); verified them one by one", size,
                  type(error).__name__, error, exc_info=error)

    # -- websocket side ------------------------------------------------------------------------

    async def _run(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def handle(self, ws: ServerConnection) -> None:
        """Serve one connection. Until it holds a session it must send a Hello that succeeds within
        ``limits.hello_timeout_s`` of connecting, or it gets ErrorFrame("timeout") and is closed."""
        self.stats["connections"] += 1
        sid: str | None = None
        bye = False
        hello_by = time.monotonic() + self.limits.hello_timeout_s
        try:
            while True:
                try:
                    message = await self._receive(ws, None if sid is not None else hello_by)
                except TimeoutError:
                    why = f"no session within {self.limits.hello_timeout_s:g} s of connecting; send hello first"
                    await self._close_with(ws, self._error("timeout", why), "hello_timeout")
                    break
                reply, sid = await self._on_message(message, sid, ws)
                if reply is None:
                    bye = True
                    break
                await ws.send(encode(reply))
        except websockets.ConnectionClosed:
            pass
        finally:
            self.gate.release(ws)
            if bye:
                self.sessions.drop(sid, ws)
            else:  # vanished: keep the KV for a resume during the grace period
                self.sessions.detach(sid, ws)
            self._refresh_gauges()

    @staticmethod
    async def _receive(ws: ServerConnection, deadline: float | None):
        if deadline is None:
            return await ws.recv()
        return await asyncio.wait_for(ws.recv(), deadline - time.monotonic())  # cancelling recv loses nothing

    async def _close_with(self, ws: ServerConnection, frame: ErrorFrame, reason: str) -> None:
        """Send ``frame`` and close ``ws`` (within CLOSE_S, else abort); counted by ``reason``."""
        self.metrics.connections_closed.labels(reason).inc()
        log.info("closing the connection from %s (%s): %s", _peer(ws), reason, frame.reason)
        async def say_and_close() -> None:
            await ws.send(encode(frame))
            await ws.close(1008 if reason == "hello_timeout" else 1000, reason)

        try:
            await asyncio.wait_for(say_and_close(), CLOSE_S)
        except (TimeoutError, websockets.ConnectionClosed):
            pass
        finally:
            if ws.transport is not None and ws.state is not State.CLOSED:
                ws.transport.abort()

    def _evict(self, ws: ServerConnection, frame: ErrorFrame, reason: str) -> None:
        """Close a connection whose session the server took away (reaped, resumed elsewhere)."""
        task = asyncio.get_running_loop().create_task(self._close_with(ws, frame, reason))
        self._closers.add(task)
        task.add_done_callback(self._closers.discard)

    def _full(self) -> ErrorFrame:
        return self._error("full", f"the cloud is at its limit of {self.limits.max_sessions} sessions "
                                   "(--max-sessions); retry later")

    def _error(self, code: str, reason: str, round_id: int | None = None) -> ErrorFrame:
        self.stats["errors"] += 1
        self.metrics.error(code)
        return ErrorFrame(code, reason, round_id)

    async def _on_message(self, message, sid, ws=None):
        """Return (reply frame or None to close, session id)."""
        try:
            frame = decode(message)
        except WireError as e:
            return self._error(e.code, e.reason), sid
        if isinstance(frame, Bye):
            return None, sid
        if isinstance(frame, Hello):
            answer = await self._hello(frame, sid, ws)
            if self.answer_delay is not None:  # the link's delay holds Ready as it holds a verdict
                await asyncio.sleep(self.answer_delay())
            return answer
        if isinstance(frame, Tree):
            entry = self.sessions.entry(sid)
            if entry is None or entry.owner is not ws:
                why = "send a hello frame before trees" if sid is None else "the session expired or moved to another connection"
                return self._error("no_session", why, frame.round), sid
            entry.last_active = self.sessions.clock()
            return await asyncio.shield(self._verify(entry, frame)), sid
        return self._error("unexpected", f"a client may not send {frame.T} frames"), sid

    async def _hello(self, h: Hello, sid, ws):
        if sid is not None:
            return self._error("bad_state", "this connection already has a session"), sid
        if self.tokenizer and h.tokenizer and h.tokenizer != self.tokenizer:
            return self._error("incompatible", f"the edge's tokenizer (fingerprint {h.tokenizer}) is not the "
                                               f"target's ({self.tokenizer}): use a draft of the target's family"), sid
        try:
            params = SamplingParams(h.temperature, h.top_p, h.top_k, h.seed)
        except (ValueError, RapidError) as e:
            return self._error("bad_hello", str(e)), sid
        max_nodes = max(1, min(h.max_nodes, self.limits.max_nodes))
        kind = "new"
        if h.session is not None:
            e = self.sessions.entry(h.session)
            if e is not None and e.session.params == params and e.session.tokens[:len(h.prompt)] == list(h.prompt) \
                    and len(e.session.tokens) - len(h.prompt) <= e.session.max_nodes + 1:
                if e.owner is not None and e.owner is not ws:  # it may not know it is dead: close it
                    self._evict(e.owner, self._error("no_session", f"session {e.sid} was resumed on another connection"),
                                "moved")
                self.sessions.attach(e.sid, ws)
                e.session.logprobs = h.logprobs
                self.stats["resumed"] += 1
                self.metrics.sessions.labels("resumed").inc()
                self._refresh_gauges()
                log.info("session %s resumed at %d committed tokens", e.sid, len(e.session.tokens))
                return Ready(e.sid, self.model.config.vocab_size, e.session.capacity, e.session.max_nodes,
                             len(e.session.tokens), self.flat_nodes, self.tokenizer, *self.curve), e.sid
            kind = "reprefilled"  # the cloud lost it (restart, expiry): prefill the committed tokens
        if not self.sessions.make_room():
            return self._full(), sid
        try:
            session = await self._run(
                lambda: TargetSession(self.model, h.prompt, params, self.limits.max_context, max_nodes,
                                      self.verify_mode, h.logprobs))
        except (ValueError, RapidError) as e:
            code = "context" if isinstance(e, PromptTooLongError) else "bad_hello"
            return self._error(code, str(e)), sid
        if not self.sessions.make_room():  # others were admitted while this one prefilled
            return self._full(), sid
        sid = self.sessions.add(session, ws)
        self.metrics.sessions.labels(kind).inc()
        self._refresh_gauges()
        log.info("session %s (%s): prompt of %d tokens", sid, kind, len(h.prompt))
        return Ready(sid, self.model.config.vocab_size, session.capacity, max_nodes, len(session.tokens),
                     self.flat_nodes, self.tokenizer, *self.curve), sid

    async def _verify(self, entry: Entry, t: Tree):
        t0 = time.perf_counter()
        async with entry.lock:  # one tree of a session at a time; a re-sent tree waits here
            stored = entry.verdicts.get(t.round)
            if stored is not None:
                tokens, parents, frame = stored
                if tokens != list(t.tokens) or parents != list(t.parents):
                    return self._error("stale_round", f"round {t.round} was already verified with another tree", t.round)
                self.stats["replayed"] += 1
                self.metrics.replayed.inc()
                return frame
            if entry.verdicts and t.round <= next(reversed(entry.verdicts)):
                return self._error("stale_round", f"round {t.round} is older than the last verified round", t.round)
            session = entry.session
            try:
                if self.batcher is not None:
                    verdict = await self.batcher.submit(session, t.tokens, t.parents)
                else:
                    verdict = await self._run(self._verify_one, session, t.tokens, t.parents)
            except RapidError as e:
                return self._error("bad_tree", str(e), t.round)
            except Exception as e:  # a crash in one session's verification stays in that session
                log.exception("verification failed")
                return self._error("internal", f"verification failed: {type(e).__name__}", t.round)
            scores = session.last_scores  # the scores of this verdict (one tree of a session at a time)
            frame = VerdictFrame(t.round, list(verdict.path), verdict.bonus, len(session.tokens),
                                 time.perf_counter() - t0, scores.logprobs, scores.top_ids, scores.top_logprobs)
            entry.remember(t.round, t.tokens, t.parents, frame)  # before any send: survives a drop
            self.stats["rounds"] += 1
            self.metrics.verdict(len(t.tokens), len(verdict.path), time.perf_counter() - t0)
        if self.answer_delay is not None:
            await asyncio.sleep(self.answer_delay())
        return frame

    def _verify_one(self, session: TargetSession, tokens, parents):
        t0 = time.perf_counter()
        v = session.verify(tokens, parents)
        self._on_batch(1, time.perf_counter() - t0)
        return v

    async def reap_forever(self, every_s: float | None = None) -> None:
        every = every_s or max(0.05, min(1.0, self.limits.grace_s / 4 or 1.0, self.limits.idle_timeout_s / 4))
        while True:
            await asyncio.sleep(every)
            for sid, why, owner in self.sessions.reap():
                log.info("session %s freed (%s)", sid, why)
                if owner is not None:
                    self._evict(owner, self._error("timeout", f"session {sid} was freed after "
                                f"{self.limits.idle_timeout_s:g} s without a frame; connect again"), "idle")
            self._refresh_gauges()


async def serve_forever(server: VerifierServer, host: str, port: int,
                        ready: asyncio.Event | None = None, stop: asyncio.Event | None = None,
                        ssl=None) -> None:
    reaper = asyncio.create_task(server.reap_forever())
    try:
        async with serve(server.handle, host, port, max_size=TRANSPORT_MAX_BYTES, compression=None,
                         process_request=server.process_request, ssl=ssl) as ws_server:
            addr = ws_server.sockets[0].getsockname()
            log.info("verifier listening on %s://%s:%d", "wss" if ssl else "ws", addr[0], addr[1])
            server.port = addr[1]
            if ready is not None:
                ready.set()
            await (stop.wait() if stop is not None else asyncio.Future())
    finally:
        reaper.cancel()
        if server.batcher is not None:
            await server.batcher.close()
