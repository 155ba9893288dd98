"""The cloud's connection admission: a cap on open websocket connections (no model work).

A connection is admitted in the HTTP upgrade (``process_request``), after the token check and
before the handshake completes, and released when its handler ends. A handshake that fails after
admission never reaches the handler; its connection is released when it is seen closed, the next
time the gate counts. Beyond ``cap`` the upgrade is refused (HTTP 503), so silent connections
cannot pile up to the process's file-descriptor limit.
"""

from __future__ import annotations

from typing import Any

from websockets.protocol import State


class ConnectionGate:
    def __init__(self, cap: int) -> None:
        if cap < 1:
            raise ValueError(f"the connection cap must be >= 1, got {cap}")
        self.cap = cap
        self._admitted: set[Any] = set()

    @property
    def open(self) -> int:
        """Admitted connections that are not closed yet."""
        self._admitted = {c for c in self._admitted if getattr(c, "state", None) is not State.CLOSED}
        return len(self._admitted)

    def admit(self, connection: Any) -> bool:
        """Count ``connection`` in, or False when ``cap`` connections are open already."""
        if connection in self._admitted:
            return True
        if self.open >= self.cap:
            return False
        self._admitted.add(connection)
        return True

    def release(self, connection: Any) -> None:
        self._admitted.discard(connection)
