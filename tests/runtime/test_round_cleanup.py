"""Issue 11, items 1, 2 and 4: a failed round leaves no worker running on the engine, no verdict
is awaited forever, and a request that cannot fit the cloud's context is refused before any
round. Real websocket on loopback; the faulty cloud is a proxy in front of the real verifier."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

from rapid.core.errors import ContextFullError
from rapid.core.procs import free_port
from rapid.core.sampling import SamplingParams
from rapid.core.wire import ErrorFrame, Tree, decode, encode
from rapid.engines.torch_engine import TorchEngine
from rapid.runtime.coordinator import Coordinator, CoordinatorConfig
from rapid.runtime.drafter import Drafter
from rapid.runtime.link import CloudError, CloudLink
from rapid.runtime.policies import POLICIES
from rapid.runtime.tree import TreeParams
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.serve_config import Limits
from rapid.server.target import reference_decode
from rapid.tiny import EOS_ID


class FailingRoundProxy:
    """Forwards to ``upstream``; on the first connection, answers its ``fail_at``-th tree with a
    non-retryable error frame instead of forwarding it."""

    def __init__(self, upstream: str, fail_at: int = 2) -> None:
        self.upstream, self.fail_at, self.connections = upstream, fail_at, 0
        self.port = free_port()
        self.url = f"ws://127.0.0.1:{self.port}"

    async def handle(self, edge) -> None:
        self.connections += 1
        first, trees = self.connections == 1, 0
        async with connect(self.upstream, compression=None) as cloud:
            async def down() -> None:
                async for m in cloud:
                    await edge.send(m)

            pump = asyncio.create_task(down())
            try:
                async for m in edge:
                    frame = decode(m)
                    if isinstance(frame, Tree):
                        trees += 1
                        if first and trees == self.fail_at:
                            await edge.send(encode(ErrorFrame("internal", "injected failure", frame.round)))
                            continue
                    await cloud.send(m)
            finally:
                pump.cancel()


def _drafter(drafts) -> Drafter:
    return Drafter(TorchEngine(drafts["partial"], capacity=512), TreeParams(4, 12, 2, 2), (EOS_ID,))


def test_a_failed_round_stops_the_branch_before_the_engine_is_reused(tiny_pair):
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target))
    proxy = FailingRoundProxy(server.url)
    steps: list[tuple[float, str]] = []
    cfg = CoordinatorConfig(depth=4, step_delay_s=0.05)  # slow steps: the branch is mid-way at the error

    def hook(phase: str, k: int) -> None:
        steps.append((time.perf_counter(), threading.current_thread().name))

    async def scenario():
        async with serve(proxy.handle, "127.0.0.1", proxy.port, compression=None):
            drafter = _drafter(drafts)
            coord = Coordinator(drafter, CloudLink(proxy.url), POLICIES["npdg"], cfg, step_hook=hook)
            with pytest.raises(CloudError) as e:
                await coord.generate(list(b"the failing request"), 24, SamplingParams())
            failed_at = time.perf_counter()
            assert e.value.code == "internal"
            await asyncio.sleep(0.3)  # a runaway branch would step here
            late = [t for t, _ in steps if t > failed_at]
            again = Coordinator(drafter, CloudLink(proxy.url), POLICIES["npdg"], cfg)
            prompt = list(b"the next request on the same engine")
            gen = await again.generate(prompt, 24, SamplingParams())
            return late, gen.tokens, prompt

    try:
        late, tokens, prompt = asyncio.run(scenario())
    finally:
        server.close()
    assert late == [], f"{len(late)} draft steps ran after the failed request returned"
    assert len(steps) > 0
    assert tokens == reference_decode(target, prompt, 24, SamplingParams(), (EOS_ID,))


def test_cancelling_a_generation_waits_for_its_draft_thread(tiny_pair):
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target))
    steps: list[float] = []
    cfg = CoordinatorConfig(depth=6, step_delay_s=0.05)

    async def scenario():
        coord = Coordinator(_drafter(drafts), CloudLink(server.url), POLICIES["rapid"], cfg,
                            step_hook=lambda phase, k: steps.append(time.perf_counter()))
        task = asyncio.create_task(coord.generate(list(b"cancel me"), 40, SamplingParams()))
        while len(steps) < 3:
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        done = time.perf_counter()
        await asyncio.sleep(0.3)
        return [t for t in steps if t > done]

    try:
        assert asyncio.run(scenario()) == []
    finally:
        server.close()


def test_a_request_over_the_clouds_context_is_refused_before_any_round(tiny_pair):
    target, drafts = tiny_pair
    server = BackgroundServer(VerifierServer(target, limits=Limits(max_context=80)))
    steps: list[str] = []
    try:
        coord = Coordinator(_drafter(drafts), CloudLink(server.url), POLICIES["npdg"], CoordinatorConfig(depth=8),
                            step_hook=lambda phase, k: steps.append(phase))
        with pytest.raises(ContextFullError, match="cloud context of .* the cloud has 80"):
            asyncio.run(coord.generate(list(range(40)), 40, SamplingParams()))
        # refused at Ready: round 0's tree may have been drafted while the cloud prefilled (at most
        # its 8 levels), but nothing was sent (a branch steps only after a send)
        assert set(steps) <= {"draft"} and len(steps) <= 8, steps
        ok = Coordinator(_drafter(drafts), CloudLink(server.url), POLICIES["npdg"], CoordinatorConfig(depth=8))
        prompt = list(range(30))
        gen = asyncio.run(ok.generate(prompt, 30, SamplingParams()))  # 30 + 30 + 12 nodes fit in 80
        assert gen.tokens == reference_decode(target, prompt, 30, SamplingParams(), (EOS_ID,))
    finally:
        server.close()
