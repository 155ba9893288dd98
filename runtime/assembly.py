"""The edge's one assembly: a Drafter over a draft engine, a CloudLink and the Coordinator that
drives them (``rapid.runtime.coordinator``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rapid.engines.base import DraftEngine
from rapid.runtime.controllers import CoordinatorConfig
from rapid.runtime.coordinator import Coordinator
from rapid.runtime.depth_control import DepthController
from rapid.runtime.drafter import Drafter
from rapid.runtime.link import CloudLink
from rapid.runtime.policies import Policy, get_policy
from rapid.runtime.tree import TreeParams


def assemble(engine: DraftEngine, tree: TreeParams, stop_ids: Sequence[int], link: CloudLink | str,
             policy: Policy | str, config: CoordinatorConfig | None = None,
             controller: DepthController | None = None, **options: Any) -> Coordinator:
    """The edge's one assembly: a Drafter over ``engine``, a CloudLink (a URL makes a plain one; build
    it yourself for a token, TLS or retry options) and the Coordinator that drives them.

    ``config`` defaults to ``CoordinatorConfig(depth=tree.depth)``; ``options`` (clock, step_hook,
    executor) go to the Coordinator.
    """
    drafter = Drafter(engine, tree, stop_ids)
    cloud = CloudLink(link) if isinstance(link, str) else link
    pol = get_policy(policy) if isinstance(policy, str) else policy
    return Coordinator(drafter, cloud, pol, config or CoordinatorConfig(depth=tree.depth), controller=controller,
                       **options)
