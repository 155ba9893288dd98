"""What the coordinator asks of a depth policy, and what a decision carries.

``CAAC`` / ``FixedDepth`` (``rapid.runtime.caac``) and ``CostAwareCAAC``
(``rapid.runtime.cost_caac``) implement ``DepthController``; each round's ``CAACDecision`` goes
into the round's telemetry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from rapid.runtime.branch_gate import BranchGate


@dataclass(slots=True, frozen=True)
class CAACDecision:
    """The depth for the next round and the signals that produced it (for telemetry)."""

    depth: int  # 0: draft nothing this round (rapid.runtime.cost_caac)
    tau_cur: float
    tau_fast: float
    tau_slow: float
    esr: float
    eta: float
    acceptance: float
    b_hat: float
    capped_by_time: bool


def round_depth(decided: int, left: int, kept: int) -> int:
    """The depth a drafting round runs: the decision, capped by ``left - 1`` (``left`` tokens still
    to generate: a verdict emits its accepted path and then the target's own bonus token, so a
    node at depth ``left`` could only repeat that bonus), at least the ``kept`` levels a proactive
    branch supplied, at least 1, except a decided 0 (a round that drafts nothing,
    ``rapid.runtime.cost_caac``) and a round with one token left: the bonus token is all its
    verdict can emit, so it drafts no step (depth 0, or the kept levels, none of them sent)."""
    depth = max(min(decided, left - 1), kept)
    return depth if decided == 0 or left <= 1 else max(1, depth)


def observed_depth(depth: int, left: int) -> int:
    """The levels a drafting round's acceptance is measured against: its ``depth``, capped by the
    ``left - 1`` levels it could send (a kept branch's deeper levels are cut; one token left: 0,
    no sample)."""
    return min(depth, left - 1)


def carried_by_chain(accepted: int, depth: int) -> bool:
    """The verdict went past the ``depth`` levels the round drafted: only a prompt-lookup chain
    reaches there, so the round says nothing of the draft's own acceptance or of a proactive
    branch (whose roots hang below drafted nodes)."""
    return accepted > depth


class DepthController(Protocol):
    """What the coordinator needs from a depth policy (CAAC or FixedDepth), and the branch gate
    that is carried with it from one request to the next."""

    gate: BranchGate

    def observe_step(self, seconds: float, tokens: int, beside: bool = False) -> None: ...

    def observe_round(self, accepted: int, depth: int, cloud_seconds: float | None = None,
                      b_hat: float | None = None) -> None: ...

    def next_depth(self, proactive: bool = False, reused: int = 0) -> CAACDecision: ...

    def observe_cloud(self, curve_nodes: Sequence[int], curve_s: Sequence[float], budget: int,
                      width: int) -> None: ...

    def observe_verdict(self, depth: int, nodes: int, verify_s: float, rtt_s: float | None,
                        accepted: int | None = None, hit: bool | None = None) -> None: ...

    def observe_lookup(self, reach: Sequence[float], nodes: int) -> None: ...

    def next_depth_if(self, accepted: int, depth: int, b_hat: float | None = None,
                      proactive: bool = True) -> CAACDecision: ...

    def snapshot(self) -> dict: ...

    def new_request(self) -> None: ...
