"""One verifier replica of the Ray Serve deployment.

Each replica is today's single-process verifier (``VerifierServer``: auth, limits, batching,
resume grace, metrics) listening on its own websocket port; the ingress reads an edge's first
frame, asks this deployment (through ``rapid.server.ray_router``) which replica to use, and
pipes the websocket to it. Session ids start with the replica's id (``scale_config``), so a
resume finds its way back. Through Serve itself go only short calls: ``endpoint``,
``metrics_text``, ``describe``, ``drain``, and Serve's own health, routing-stats and
autoscaling-stats hooks.

Stopping (scale-down, a rolling update, ``drain()``): Serve first stops routing to the replica, so no new
session and no resume lands here; ``__del__`` then keeps the websocket server up until every
attached session has ended (its edge said Bye or vanished) or ``drain_s`` passed; then it
closes. A session whose edge reconnects during the drain, or that is still attached at the end,
is re-prefilled on another replica (exact: the edge re-sends the committed tokens).
"""

from __future__ import annotations

import logging
import time

import rapid.server
from rapid.server.background import BackgroundServer
from rapid.server.main import build_verifier
from rapid.server.scale_config import log_to_stderr, session_prefix
from rapid.server.serve_config import VerifierSpec
from rapid.server.sessions import SessionTable

log = logging.getLogger("rapid.server.replica")
ANY_HOST = ("0.0.0.0", "::", "")
DRAINING_LOAD = 1 << 30  # routing stats of a draining replica: ranked last for new sessions


class VerifierReplica:
    def __init__(self, spec: VerifierSpec, token: str | None = None, host: str = "0.0.0.0",
                 drain_s: float = 60.0) -> None:
        import ray
        from ray import serve

        log_to_stderr()
        self.uid = serve.get_replica_context().replica_id.unique_id
        self.drain_s = drain_s
        self.draining = False
        self.server = build_verifier(spec, token)
        # before the server runs: every session id made here names this replica
        self.server.sessions = SessionTable(spec.limits, id_prefix=session_prefix(self.uid))
        self.bg = BackgroundServer(self.server, host)
        advertised = ray.util.get_node_ip_address() if host in ANY_HOST else host
        self.url = f"ws://{advertised}:{self.server.port}"
        log.info("replica %s: verifier at %s", self.uid, self.url)

    def _counts(self) -> tuple[int, int]:
        """(attached, detached) sessions, read on the server's loop thread."""
        table = self.server.sessions
        return self.bg.call(lambda: (len(table) - table.detached, table.detached))

    def endpoint(self) -> tuple[str, str]:
        return self.uid, self.url

    def describe(self) -> dict:
        attached, detached = self._counts()
        return {"replica": self.uid, "url": self.url, "attached": attached, "detached": detached,
                "verify_mode": self.server.verify_mode, "module": rapid.server.__file__}

    def metrics_text(self) -> tuple[str, str]:
        self.bg.call(self.server._refresh_gauges)
        return self.uid, self.server.metrics.render().decode()

    def record_routing_stats(self) -> dict:
        return {"sessions": DRAINING_LOAD if self.draining else sum(self._counts())}

    def record_autoscaling_stats(self) -> dict:
        return {"sessions": float(self._counts()[0])}

    def drain(self) -> str:
        """Retire this replica gracefully (node maintenance, a stuck device): its health checks fail
        from now on, so Serve starts a replacement and stops this one, and ``__del__`` drains."""
        self.draining = True
        log.info("replica %s: drain requested", self.uid)
        return self.uid

    def check_health(self) -> None:
        if self.draining:
            raise RuntimeError(f"replica {self.uid} is draining (drain() was called)")
        if not self.bg.alive:
            raise RuntimeError(f"replica {self.uid}: the verifier's websocket server stopped")

    def __del__(self) -> None:
        """Drain (module docstring), then close the websocket server."""
        bg = getattr(self, "bg", None)
        if bg is None or not bg.alive:
            return
        deadline = time.monotonic() + self.drain_s
        attached = self._counts()[0]
        if attached:
            log.info("replica %s stopping: draining %d attached session(s) for up to %.0fs",
                     self.uid, attached, self.drain_s)
        while attached and time.monotonic() < deadline:
            time.sleep(0.2)
            attached = self._counts()[0]
        if attached:
            log.warning("replica %s: %d session(s) still attached after %.0fs; they will be re-prefilled "
                        "elsewhere", self.uid, attached, self.drain_s)
        bg.close()
