"""Fault injection between edge and cloud: output stays identical to target-only decoding.

``FaultProxy`` is a websocket proxy on loopback that forwards whole messages between the edge
and a verifier and, on a seeded schedule, drops, delays, duplicates messages, cuts connections,
and "restarts the cloud" (cuts, then sends every later connection to another verifier that has
never seen the session, so the link must re-establish it by prefilling the committed tokens).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import serve

from rapid.core.sampling import SamplingParams
from rapid.engines.torch_engine import TorchEngine
from rapid.runtime.coordinator import Coordinator, CoordinatorConfig
from rapid.runtime.drafter import Drafter
from rapid.runtime.link import CloudLink
from rapid.runtime.policies import POLICIES
from rapid.runtime.tree import TreeParams
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.serve_config import Limits
from rapid.server.target import reference_decode
from rapid.tiny import EOS_ID


class FaultProxy:
    """Seeded message-level faults. Probabilities are per forwarded message."""

    def __init__(self, upstreams: list[str], seed: int = 0, drop: float = 0.04, dup: float = 0.05,
                 delay: float = 0.1, cut: float = 0.03, failover: float = 0.0, max_delay_s: float = 0.03) -> None:
        self.upstreams = upstreams
        self.current = 0
        self.rng = random.Random(seed)
        self.p = {"drop": drop, "dup": dup, "delay": delay, "cut": cut, "failover": failover}
        self.max_delay_s = max_delay_s
        self.events: Counter = Counter()
        self.enabled = True
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        started = threading.Event()

        async def main() -> None:
            self._stop = asyncio.Event()
            async with serve(self._handle, "127.0.0.1", 0, compression=None, max_size=None) as srv:
                self.url = f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
                started.set()
                await self._stop.wait()

        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(main(),), daemon=True)
        self._thread.start()
        assert started.wait(10)

    def _fault(self) -> str | None:
        if not self.enabled:
            return None
        r = self.rng.random()
        for name, p in self.p.items():
            if r < p:
                return name
            r -= p
        return None

    async def _handle(self, client) -> None:
        auth = client.request.headers.get("Authorization")
        try:
            up = await connect(self.upstreams[self.current], compression=None, max_size=None,
                               additional_headers={"Authorization": auth} if auth else {})
        except Exception:
            self.events["refused"] += 1
            return
        done = asyncio.Event()

        def cut() -> None:
            for ws in (client, up):
                if ws.transport is not None:
                    ws.transport.abort()
            done.set()

        async def pump(src, dst) -> None:
            try:
                async for msg in src:
                    fault = self._fault()
                    if fault:
                        self.events[fault] += 1
                    if fault in ("cut", "failover"):
                        if fault == "failover":
                            self.current = (self.current + 1) % len(self.upstreams)
                        cut()
                        return
                    if fault == "drop":
                        continue
                    if fault == "delay":
                        await asyncio.sleep(self.rng.random() * self.max_delay_s)
                    await dst.send(msg)
                    if fault == "dup":
                        await dst.send(msg)
            except Exception:
                pass
            finally:
                done.set()

        tasks = [asyncio.create_task(pump(client, up)), asyncio.create_task(pump(up, client))]
        await done.wait()
        for ws in (client, up):
            if ws.transport is not None:
                ws.transport.abort()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def close(self) -> None:
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture(scope="module")
def clouds(tiny_pair):
    target, _ = tiny_pair
    limits = Limits(max_sessions=64, max_context=512, max_nodes=128, grace_s=20.0)
    a = BackgroundServer(VerifierServer(target, limits))
    b = BackgroundServer(VerifierServer(target, limits, max_batch=4, batch_window_ms=1.0))
    yield a, b
    a.close()
    b.close()


def run_edge(url, draft, policy, prompt, max_new, sampling, tree, seed):
    link = CloudLink(url, retry_timeout=0.25, backoff_s=0.01, backoff_max_s=0.1, max_retry_s=20,
                     rng=random.Random(seed))
    drafter = Drafter(TorchEngine(draft, capacity=1024), tree, (EOS_ID,))
    coord = Coordinator(drafter, link, POLICIES[policy], CoordinatorConfig(depth=tree.depth))
    gen = asyncio.run(coord.generate(prompt, max_new, sampling))
    return gen, link


def test_exact_through_faulty_network_all_policies(clouds, tiny_pair):
    """Many seeds × every policy × greedy/seeded sampling, through drops, delays, duplicates,
    cuts and cloud restarts: every output equals target-only decoding."""
    target, drafts = tiny_pair
    a, b = clouds
    t_end = time.monotonic() + 50
    policies = sorted(POLICIES)
    samplings = [SamplingParams(), SamplingParams(temperature=0.9, top_p=0.95, seed=1234),
                 SamplingParams(temperature=1.3, top_k=20, seed=7)]
    totals: Counter = Counter()
    runs = 0
    for seed in range(1000):
        if time.monotonic() > t_end:
            break
        rng = random.Random(seed)
        proxy = FaultProxy([a.url, b.url], seed=seed, failover=0.02)
        try:
            policy = policies[seed % len(policies)]
            sampling = samplings[(seed // len(policies)) % len(samplings)]
            draft = ["same", "partial", "unrelated"][seed % 3]
            prompt = [rng.randrange(256) for _ in range(rng.randint(1, 12))]
            max_new = rng.randint(8, 28)
            tree = TreeParams(rng.randint(1, 5), rng.randint(2, 16), rng.randint(1, 3), rng.randint(1, 3))
            expected = reference_decode(target, prompt, max_new, sampling, (EOS_ID,))
            gen, link = run_edge(proxy.url, drafts[draft], policy, prompt, max_new, sampling, tree, seed)
            assert gen.tokens == expected, (seed, policy, sampling, dict(proxy.events), link.stats)
            totals.update(proxy.events)
            totals.update({f"link_{k}": v for k, v in link.stats.items()})
            runs += 1
        finally:
            proxy.close()
    replayed = a.server.stats["replayed"] + b.server.stats["replayed"]
    print(f"\n{runs} faulty runs: {dict(totals)}; verdicts replayed by the cloud: {replayed}")
    assert runs >= 2 * len(policies)
    for kind in ("drop", "dup", "delay", "cut", "failover"):
        assert totals[kind] > 0, kind
    assert totals["link_reprefilled"] > 0 and totals["link_resumed"] > 0
    assert replayed > 0  # a re-sent tree was answered from the stored verdict


def test_late_and_duplicated_verdicts_are_ignored(tiny_pair):
    """Every message duplicated: each verdict arrives twice; the second is recognised as stale."""
    target, drafts = tiny_pair
    cloud = BackgroundServer(VerifierServer(target))
    proxy = FaultProxy([cloud.url], seed=3, drop=0, dup=1.0, delay=0, cut=0)
    try:
        prompt = list(b"duplicates")
        gen, link = run_edge(proxy.url, drafts["partial"], "rapid", prompt, 20, SamplingParams(),
                             TreeParams(3, 8, 2, 2), 0)
        assert gen.tokens == reference_decode(target, prompt, 20, SamplingParams(), (EOS_ID,))
        assert link.stats["stale"] > 0
        assert cloud.server.stats["replayed"] > 0  # the duplicated tree was answered, not re-verified
    finally:
        proxy.close()
        cloud.close()


def test_cloud_restart_reprefills_committed_tokens(tiny_pair):
    """The cloud that held the session goes away for good mid-generation; a fresh one takes over."""
    target, drafts = tiny_pair
    first = BackgroundServer(VerifierServer(target))
    second = BackgroundServer(VerifierServer(target))
    proxy = FaultProxy([first.url, second.url], seed=0, drop=0, dup=0, delay=0, cut=0)
    try:
        prompt = list(b"restart")
        sampling = SamplingParams(temperature=1.0, seed=99)
        calls = {"n": 0}

        def hook(phase, k):
            calls["n"] += 1
            if calls["n"] == 6:  # mid-generation: kill the first cloud, the proxy now dials the second
                proxy.current = 1
                first.close()

        link = CloudLink(proxy.url, retry_timeout=0.5, backoff_s=0.01, max_retry_s=20)
        drafter = Drafter(TorchEngine(drafts["partial"], capacity=1024), TreeParams(3, 6, 2, 2), (EOS_ID,))
        coord = Coordinator(drafter, link, POLICIES["rapid"], CoordinatorConfig(depth=3), step_hook=hook)
        gen = asyncio.run(coord.generate(prompt, 30, sampling))
        assert gen.tokens == reference_decode(target, prompt, 30, sampling, (EOS_ID,))
        assert link.stats["reprefilled"] >= 1
    finally:
        proxy.close()
        second.close()


def test_unreachable_cloud_fails_fast_on_open():
    from rapid.core.wire import Hello
    from rapid.runtime.link import CloudError

    link = CloudLink("ws://127.0.0.1:9", open_timeout=2)
    with pytest.raises(CloudError) as e:
        asyncio.run(link.open(Hello([1, 2])))
    assert e.value.code == "unreachable"
