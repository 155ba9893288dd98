"""The websocket ingress of the Ray Serve verifier: auth, routing by the first frame, a pipe.

An edge connects to the one public URL (Serve's HTTP proxy, ``ws://`` or ``wss://``). The
ingress

1. checks ``Authorization: Bearer <token>`` on the upgrade and answers **HTTP 401** before the
   handshake ends when it is wrong (as the single-process server does);
2. reads the first frame. A ``Hello(session=id)`` whose id names a replica
   (``scale_config.replica_of``) is routed to that replica if it is alive (*sticky*); if it is
   gone, to the least loaded one, which re-prefills the committed tokens (*failover*). Anything
   else (a new Hello, garbage) goes to the least loaded replica, which answers it as the
   single-process server would;
3. opens a websocket to that replica's own verifier server (forwarding the Authorization
   header), sends it the first frame and pipes frames both ways until either side closes.
   When the replica dies, the edge's connection is closed, and the edge's ``CloudLink``
   reconnects and resumes or re-prefills: no frame is lost without the edge knowing.

New sessions are picked one at a time, so a burst of edges spreads evenly (the router ranks by
the connections this ingress holds per replica). ``GET /health`` is open; ``GET /metrics``
(token) is the ingress's registry plus every live replica's, each sample labelled
``replica="<id>"``.
"""

# No `from __future__ import annotations` here: Serve re-creates the route methods in its own
# module, where string annotations such as "WebSocket" would not resolve (FastAPI then answers 403).

import asyncio
import contextlib
import logging

from fastapi import FastAPI, Request, WebSocket
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from starlette.responses import PlainTextResponse, Response
from websockets.asyncio.client import connect

from rapid.core.auth import check_authorization
from rapid.core.wire import MAX_FRAME_BYTES, Hello, WireError, decode
from rapid.server.federate import federate
from rapid.server.scale_config import REGISTRY, log_to_stderr, replica_of

log = logging.getLogger("rapid.server.ingress")
CALL_TIMEOUT_S = 30.0  # an endpoint or metrics call to a replica (Serve queues while replicas start)


class IngressMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.connections = Gauge("rapid_ingress_connections", "Websockets piped to each replica", ["to"], registry=r)
        self.routed = Counter("rapid_ingress_routed", "Connections routed, by kind", ["kind"], registry=r)  # new|sticky|failover
        self.failovers = Counter("rapid_failovers", "Resumes whose replica was gone: re-prefilled on another", registry=r)
        self.upstream_lost = Counter("rapid_ingress_upstream_lost", "Pipes cut because the replica side failed", registry=r)
        self.auth_failures = Counter("rapid_auth_failures", "Handshakes rejected with HTTP 401", registry=r)
        self.replicas = Gauge("rapid_replicas_live", "Verifier replicas the router can reach", registry=r)

    def render(self) -> str:
        return generate_latest(self.registry).decode()


def wanted_replica(first: bytes | str | None) -> str | None:
    """The replica a first frame asks for (a resuming Hello's session id names it), or None."""
    if not isinstance(first, bytes):
        return None
    try:
        frame = decode(first)
    except WireError:
        return None
    return replica_of(frame.session) if isinstance(frame, Hello) else None


class IngressCore:
    """The ingress without Serve's decorators (``make_ingress`` wraps it)."""

    def __init__(self, verifier, token: str | None, hello_timeout_s: float = 10.0) -> None:
        self.verifier = verifier  # DeploymentHandle of the verifier deployment
        self.token = token
        self.hello_timeout_s = hello_timeout_s
        self.metrics = IngressMetrics()
        self._pick = asyncio.Lock()

    async def _call(self, method: str, key: str):
        h = self.verifier.options(method_name=method, session_id=key)
        return await asyncio.wait_for(h.remote(), CALL_TIMEOUT_S)

    async def _endpoint(self, want: str | None) -> tuple[str, str]:
        """(replica id, its websocket URL); counts the connection there at once."""
        if want is not None and want in REGISTRY.live:
            uid, url = await self._call("endpoint", want)
        else:
            async with self._pick:  # one new pick at a time: the next one sees this one's count
                uid, url = await self._call("endpoint", "")
                REGISTRY.open[uid] += 1
                log.debug("new session to replica %s (open connections %s)", uid, dict(REGISTRY.open))
                return uid, url
        REGISTRY.open[uid] += 1
        return uid, url

    def _release(self, uid: str) -> None:
        REGISTRY.open[uid] -= 1
        if REGISTRY.open[uid] <= 0:
            del REGISTRY.open[uid]

    async def _open_upstream(self, first, auth: str | None):
        want = wanted_replica(first)
        headers = {"Authorization": auth} if auth else {}
        for attempt in range(2):  # a replica that died since the router last heard of it: pick again
            uid = None
            try:
                uid, url = await self._endpoint(want if attempt == 0 else None)
                up = await connect(url, max_size=MAX_FRAME_BYTES, compression=None, additional_headers=headers,
                                   open_timeout=10)
            except Exception as e:  # Ray's actor errors, OSError, a refused handshake
                if uid is not None:
                    self._release(uid)
                log.warning("replica %s unreachable (%s: %s)", uid or want or "(any)", type(e).__name__, e)
                if attempt:
                    raise
                continue
            kind = "new" if want is None else ("sticky" if uid == want else "failover")
            self.metrics.routed.labels(kind).inc()
            if kind == "failover":
                self.metrics.failovers.inc()
                log.info("a session of replica %s failed over to replica %s", want, uid)
            return up, uid
        raise AssertionError("unreachable")

    async def serve_socket(self, ws: WebSocket) -> None:
        if not check_authorization(ws.headers.get("authorization"), self.token):
            self.metrics.auth_failures.inc()
            await ws.send_denial_response(PlainTextResponse("missing or wrong bearer token\n", status_code=401))
            return
        await ws.accept()
        try:
            msg = await asyncio.wait_for(ws.receive(), self.hello_timeout_s)
        except TimeoutError:
            await ws.close(code=1008, reason="no hello")
            return
        if msg["type"] == "websocket.disconnect":
            return
        first = msg.get("bytes") if msg.get("bytes") is not None else msg.get("text")
        try:
            up, uid = await self._open_upstream(first, ws.headers.get("authorization"))
        except Exception as e:  # no replica reachable: the edge retries with backoff
            log.warning("no verifier replica for a connection: %s: %s", type(e).__name__, e)
            await ws.close(code=1013, reason="no verifier replica available")
            return
        self.metrics.connections.labels(uid).set(REGISTRY.open[uid])
        try:
            await self._pipe(ws, up, first)
        finally:
            self._release(uid)
            self.metrics.connections.labels(uid).set(REGISTRY.open.get(uid, 0))

    async def _pipe(self, ws: WebSocket, up, first) -> None:
        async def edge_to_replica():
            await up.send(first)
            while True:
                msg = await ws.receive()
                if msg["type"] == "websocket.disconnect":
                    return
                await up.send(msg["bytes"] if msg.get("bytes") is not None else msg.get("text", ""))

        async def replica_to_edge():
            async for m in up:
                await (ws.send_bytes(m) if isinstance(m, bytes) else ws.send_text(m))

        e2r, r2e = asyncio.create_task(edge_to_replica()), asyncio.create_task(replica_to_edge())
        await asyncio.wait((e2r, r2e), return_when=asyncio.FIRST_COMPLETED)
        for t in (e2r, r2e):
            t.cancel()
        await asyncio.gather(e2r, r2e, return_exceptions=True)
        lost = up.close_code not in (None, 1000, 1001)  # the replica side failed or died (1006)
        if lost:
            self.metrics.upstream_lost.inc()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(up.close(), 2.0)
        with contextlib.suppress(Exception):
            await ws.close(code=1011 if lost else 1000)

    async def metrics_text(self) -> str:
        if not REGISTRY.live:  # the router starts with the first call
            with contextlib.suppress(Exception):
                await self._call("describe", "")
        parts, seen = [], set()
        for key in sorted(REGISTRY.live):
            try:
                uid, text = await self._call("metrics_text", key)
            except Exception as e:  # died since the router heard of it
                log.info("no metrics from replica %s: %s", key, e)
                continue
            if uid not in seen:  # label with the replica that really answered
                seen.add(uid)
                parts.append(({"replica": uid}, text))
        self.metrics.replicas.set(len(seen))
        return federate([({}, self.metrics.render()), *parts])


def make_ingress(serve):
    """The Serve ingress deployment class (Serve's decorators need ``ray.serve`` at hand)."""
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)

    @serve.ingress(app)
    class Ingress:
        def __init__(self, verifier, token: str | None = None, hello_timeout_s: float = 10.0) -> None:
            log_to_stderr()
            self.core = IngressCore(verifier, token, hello_timeout_s)

        @app.get("/health")
        async def health(self) -> Response:
            return PlainTextResponse("ok\n")

        @app.get("/metrics")
        async def metrics(self, request: Request) -> Response:
            if not check_authorization(request.headers.get("authorization"), self.core.token):
                self.core.metrics.auth_failures.inc()
                return PlainTextResponse("missing or wrong bearer token\n", status_code=401)
            return PlainTextResponse(await self.core.metrics_text(),
                                     media_type="text/plain; version=0.0.4; charset=utf-8")

        @app.websocket("/")
        async def socket(self, ws: WebSocket) -> None:
            await self.core.serve_socket(ws)

    return Ingress
