"""Coordinator with a caller-owned depth controller, over the real loopback websocket."""

from __future__ import annotations

import asyncio

from rapid.engines.torch_engine import TorchEngine
from rapid.runtime.coordinator import Coordinator, CoordinatorConfig, controller_for
from rapid.runtime.drafter import Drafter
from rapid.runtime.link import CloudLink
from rapid.runtime.policies import POLICIES
from rapid.runtime.tree import TreeParams
from rapid.sampling import SamplingParams
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.target import reference_decode
from rapid.tiny import EOS_ID


def test_controller_for_matches_the_policy():
    cfg = CoordinatorConfig(depth=3)
    assert type(controller_for(POLICIES["rapid"], cfg)).__name__ == "CAAC"
    assert type(controller_for(POLICIES["npdg"], cfg)).__name__ == "FixedDepth"
    assert controller_for(POLICIES["fixed"], cfg).next_depth().depth == 3


def test_carried_controller_accumulates_steps_and_stays_exact(tiny_pair):
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target))
    try:
        tree, cfg = TreeParams(4, 10, 2, 2), CoordinatorConfig(depth=4)
        ctrl = controller_for(POLICIES["rapid"], cfg)
        steps = []
        for prompt in (list(b"first prompt"), list(b"second, other prompt")):
            drafter = Drafter(TorchEngine(drafts["partial"], capacity=512), tree, (EOS_ID,))
            coord = Coordinator(drafter, CloudLink(server.url), POLICIES["rapid"], cfg, controller=ctrl)
            assert coord.controller is ctrl
            gen = asyncio.run(coord.generate(prompt, 20, SamplingParams()))
            assert gen.tokens == reference_decode(target, prompt, 20, SamplingParams(), (EOS_ID,))
            snap = ctrl.snapshot()
            steps.append(snap["steps"])
            assert snap["rounds"] == len(gen.records)  # the logical path restarted with this request
        assert steps[1] > steps[0] > 0  # the physical path carried over
    finally:
        server.close()
