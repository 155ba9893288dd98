"""Prometheus metrics of the cloud verifier (vLLM spec-decode style names).

Each ``VerifierServer`` owns a private ``CollectorRegistry`` (several servers in one process — tests,
the load script — never collide). ``GET /metrics`` on the verifier's port renders it in the text
exposition format.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


class ServerMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.sessions_active = Gauge("rapid_sessions_active", "Sessions holding target KV", registry=r)
        self.sessions_detached = Gauge("rapid_sessions_detached", "Sessions kept for resume after their connection dropped", registry=r)
        self.sessions = Counter("rapid_sessions", "Sessions opened", ["kind"], registry=r)  # new|resumed|reprefilled
        self.rounds = Counter("rapid_spec_decode_num_rounds", "Verification rounds (target tree forwards per session)", registry=r)
        self.draft_tokens = Counter("rapid_spec_decode_num_draft_tokens", "Draft tree nodes verified", registry=r)
        self.accepted = Counter("rapid_spec_decode_num_accepted_tokens", "Draft tokens accepted", registry=r)
        self.emitted = Counter("rapid_spec_decode_num_emitted_tokens", "Tokens committed (accepted + bonus)", registry=r)
        self.mean_accepted = Gauge("rapid_spec_decode_mean_accepted_length", "Mean accepted draft tokens per round", registry=r)
        self.replayed = Counter("rapid_spec_decode_num_replayed_verdicts", "Re-sent trees answered from the stored verdict", registry=r)
        self.verify_latency = Histogram("rapid_verify_latency_seconds", "Time from a tree's arrival to its verdict", buckets=LATENCY_BUCKETS, registry=r)
        self.forward_latency = Histogram("rapid_target_forward_seconds", "One (possibly batched) target forward", buckets=LATENCY_BUCKETS, registry=r)
        self.batch_failures = Counter("rapid_verify_batch_failures", "Batched forwards that failed and were split into single trees", registry=r)
        self.batch_size = Histogram("rapid_verify_batch_size", "Trees per target forward", buckets=BATCH_BUCKETS, registry=r)
        self.errors = Counter("rapid_errors", "Error frames sent, by code", ["kind"], registry=r)
        self.auth_failures = Counter("rapid_auth_failures", "Handshakes rejected with HTTP 401", registry=r)
        self.connections_open = Gauge("rapid_connections_open", "Websocket connections open (with or without a session)", registry=r)
        self.connections_refused = Counter("rapid_connections_refused", "Upgrades refused with HTTP 503 at --max-connections", registry=r)
        self.connections_closed = Counter("rapid_connections_closed", "Connections the server closed, by reason", ["reason"], registry=r)  # hello_timeout|idle|moved
        self._rounds = 0
        self._accepted = 0

    def verdict(self, nodes: int, accepted: int, latency_s: float) -> None:
        self.rounds.inc()
        self.draft_tokens.inc(nodes)
        self.accepted.inc(accepted)
        self.emitted.inc(accepted + 1)
        self.verify_latency.observe(latency_s)
        self._rounds += 1
        self._accepted += accepted
        self.mean_accepted.set(self._accepted / self._rounds)

    def error(self, code: str) -> None:
        self.errors.labels(code).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
