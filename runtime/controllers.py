"""Which depth controller a policy uses, and the coordinator's configuration it is built from."""

from __future__ import annotations

from dataclasses import dataclass, field

from rapid.runtime.caac import CAAC, CAACConfig, FixedDepth
from rapid.runtime.cost_caac import CostAwareCAAC
from rapid.runtime.cost_model import CostConfig
from rapid.runtime.depth_control import DepthController
from rapid.runtime.policies import Policy

__all__ = ["CoordinatorConfig", "controller_for"]


@dataclass(slots=True)
class CoordinatorConfig:
    depth: int = 4  # fixed depth, and CAAC's initial/base depth
    caac: CAACConfig = field(default_factory=CAACConfig)
    cost: CostConfig = field(default_factory=CostConfig)  # the cost-aware policy's estimates
    step_delay_s: float = 0.0  # injected per-step delay (tests, contention experiments)


def controller_for(policy: Policy, config: CoordinatorConfig) -> DepthController:
    """The depth controller a policy uses: CostAwareCAAC for a cost-aware policy, CAAC when it
    adapts the depth, else FixedDepth."""
    if policy.cost_aware:
        return CostAwareCAAC(config.caac, initial_depth=config.depth, cost=config.cost)
    if policy.adaptive_depth:
        return CAAC(config.caac, initial_depth=config.depth)
    return FixedDepth(config.depth, config.caac)
