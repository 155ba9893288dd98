"""Ray Serve autoscaling policy for the verifier: replicas follow the attached sessions.

Every replica reports ``sessions`` (attached sessions, i.e. KV held for a live edge) through
``record_autoscaling_stats``; the policy asks for

    n = ⌈Σ_replicas sessions / target_sessions⌉

and Serve clamps n into [min_replicas, max_replicas] and applies the up/down-scale delays.
Sessions, not requests, are the load: a session holds target KV for its whole generation, while
the only Serve requests a replica sees are short endpoint and metrics calls.

Serve pickles this module by value into its controller, so it imports nothing from rapid.
"""

from __future__ import annotations

import math


def desired_replicas(sessions: float, target: int) -> int:
    """n = ⌈sessions / target⌉ (0 when idle; Serve's min_replicas bounds it)."""
    return max(0, math.ceil(sessions / target - 1e-9))


class SessionsPolicy:
    def __init__(self, target_sessions: int = 8) -> None:
        if target_sessions < 1:
            raise ValueError(f"target_sessions must be >= 1, got {target_sessions}")
        self.target = target_sessions

    def __call__(self, ctx):
        per_replica = (ctx.aggregated_metrics or {}).get("sessions", {})
        total = float(sum(per_replica.values()))
        return desired_replicas(total, self.target), {"sessions": total}
