"""Cloud scale-out on Ray Serve: the configuration, the Serve options it maps to, session ids that
name their replica, and the per-process routing registry (no Ray import here).

A session id made by a replica is ``"<replica id>.<16 hex>"`` (``session_prefix``), so the ingress
knows from a resuming ``Hello(session=id)`` which replica holds the session (``replica_of``); an
id without a dot (the single-process server) names no replica.

``REGISTRY`` is shared, inside one ingress process, by the ingress and the session router that
Ray Serve runs in that process: the router publishes the replica ids it can route to
(``live``), the ingress counts the connections it holds per replica (``open``), and the router
sends new sessions to the replica with the fewest.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

ROUTER_CLASS = "rapid.server.ray_router.SessionRouter"
POLICY_CLASS = "rapid.server.ray_scale:SessionsPolicy"


def log_to_stderr(level: int = logging.INFO) -> None:
    """Ray workers leave the root logger at WARNING: show rapid's own lines in the replica logs."""
    logger = logging.getLogger("rapid")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(level)
        logger.propagate = False


def session_prefix(replica_id: str) -> str:
    return f"{replica_id}."


def replica_of(session_id: str | None) -> str | None:
    """The replica a session id names, or None (no id, or one from a single-process server)."""
    if not session_id:
        return None
    head, dot, _ = session_id.rpartition(".")
    return head if dot and head else None


@dataclass(slots=True)
class Registry:
    live: frozenset[str] = frozenset()  # replica ids the router of this process routes to
    open: Counter = field(default_factory=Counter)  # connections this ingress holds, per replica


REGISTRY = Registry()


@dataclass(slots=True, frozen=True)
class ScaleOut:
    """How many replicas, on what resources, and how they start, drain and are watched.

    Fixed size: ``replicas``. Autoscaling: ``min_replicas`` ≤ n ≤ ``max_replicas``, starting at
    ``replicas`` clamped into the bounds, aiming at ``target_sessions`` per replica
    (``rapid.server.ray_scale``).
    """

    replicas: int = 1
    min_replicas: int | None = None
    max_replicas: int | None = None
    num_gpus: float = 0.0  # per replica
    num_cpus: float = 1.0  # per replica
    ingress_replicas: int = 1
    target_sessions: int = 8  # autoscaling target: attached sessions per replica
    drain_s: float = 60.0  # a stopping replica keeps serving its attached sessions this long
    health_check_s: float = 2.0
    replica_host: str = "0.0.0.0"  # where each replica's own websocket listens (the ingress dials it)
    hello_timeout_s: float = 10.0  # the ingress closes a connection that sends no first frame

    def __post_init__(self) -> None:
        for flag, value in (("--replicas", self.replicas), ("--ingress-replicas", self.ingress_replicas),
                            ("--target-sessions", self.target_sessions)):
            if value < 1:
                raise ValueError(f"{flag} must be >= 1, got {value}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ValueError("autoscaling needs both --min-replicas and --max-replicas")
        if self.min_replicas is not None and not 0 <= self.min_replicas <= self.max_replicas or \
                self.max_replicas is not None and self.max_replicas < 1:
            raise ValueError(f"need 0 <= min_replicas <= max_replicas and max_replicas >= 1: {self}")
        if self.num_gpus < 0 or self.num_cpus < 0 or self.drain_s < 0 or self.health_check_s <= 0 \
                or self.hello_timeout_s <= 0:
            raise ValueError(f"nonsensical scale-out settings: {self}")

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None


def verifier_options(so: ScaleOut) -> dict:
    """Ray Serve deployment options of the verifier (``Deployment.options(**...)``).

    A stopping replica gets ``drain_s`` to finish its attached sessions, plus 5 s to close.
    """
    opts = {
        "name": "Verifier",
        "ray_actor_options": {"num_cpus": so.num_cpus, "num_gpus": so.num_gpus},
        "max_ongoing_requests": 256,  # only endpoint/metrics calls go through Serve: all short
        "health_check_period_s": so.health_check_s,
        "health_check_timeout_s": max(10.0, 5 * so.health_check_s),
        "graceful_shutdown_wait_loop_s": 0.5,
        "graceful_shutdown_timeout_s": so.drain_s + 5.0,
        "logging_config": {"enable_access_log": False},  # rapid logs its own lines
        "request_router_config": {"request_router_class": ROUTER_CLASS,
                                  "request_routing_stats_period_s": 2.0},
    }
    if so.autoscaling:
        opts["autoscaling_config"] = {
            "min_replicas": so.min_replicas, "max_replicas": so.max_replicas,
            "initial_replicas": min(so.max_replicas, max(so.min_replicas, so.replicas)),
            "upscale_delay_s": 10.0, "downscale_delay_s": 120.0,
            "policy": {"policy_function": POLICY_CLASS, "policy_kwargs": {"target_sessions": so.target_sessions}},
        }
    else:
        opts["num_replicas"] = so.replicas
    return opts


def ingress_options(so: ScaleOut) -> dict:
    return {"name": "Ingress", "num_replicas": so.ingress_replicas, "ray_actor_options": {"num_cpus": 0},
            "max_ongoing_requests": 100_000,  # one per open websocket
            "logging_config": {"enable_access_log": False}}

