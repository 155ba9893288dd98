"""The verifier's Ray Serve request router: strict session affinity, new sessions to the least
loaded replica.

The ingress calls the verifier with ``handle.options(session_id=key)``: ``key`` is the replica id
a resuming session names (``scale_config.replica_of``), or empty for a new session.

- key is a live replica → that replica only (strict affinity: no fallback; if it is momentarily
  full the request waits with backoff);
- otherwise (new session; or the named replica is gone, so the session will be re-prefilled) →
  every live replica, ranked by (connections this ingress holds there, sessions it reports via
  ``record_routing_stats``), fewest first.

This module is imported only where Ray Serve runs (it subclasses Serve's RequestRouter). Serve
pickles it by value, so the shared registry is reached through its module (``scale_config``),
which is imported by reference.
"""

from __future__ import annotations

import random

from ray.serve.request_router import RequestRouter

from rapid.server import scale_config


def rank(candidates: list, key: str, open_conns) -> list[list]:
    """Ranked singleton groups of replicas for ``key`` (see the module docstring)."""
    for r in candidates:
        if key and r.replica_id.unique_id == key:
            return [[r]]
    jitter = {id(r): random.random() for r in candidates}

    def load(r):
        stats = r.routing_stats or {}
        return open_conns.get(r.replica_id.unique_id, 0), stats.get("sessions", 0), jitter[id(r)]

    return [[r] for r in sorted(candidates, key=load)]


class SessionRouter(RequestRouter):
    def initialize_state(self, **kwargs) -> None:
        pass

    def _publish(self) -> None:
        scale_config.REGISTRY.live = frozenset(r.unique_id for r in self._replica_id_set)

    def update_replicas(self, replicas) -> None:
        super().update_replicas(replicas)
        self._publish()

    def on_replica_actor_died(self, replica_id) -> None:
        super().on_replica_actor_died(replica_id)
        self._publish()

    async def choose_replicas(self, candidate_replicas, pending_request=None):
        if not candidate_replicas:
            return []
        key = ""
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
            key = pending_request.metadata.session_id or ""
        return rank(candidate_replicas, key, scale_config.REGISTRY.open)
