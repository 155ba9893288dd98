"""Cloud-side fault tolerance: resume within the grace period, stored verdicts for re-sent trees,
freeing a vanished client's KV, crash isolation, idle timeout, admission when full."""

from __future__ import annotations

import asyncio
import time

import pytest
import websockets
from websockets.asyncio.client import connect

from rapid.core.sampling import SamplingParams
from rapid.core.wire import Bye, ErrorFrame, Hello, Ready, Tree, VerdictFrame, decode, encode
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.target import reference_decode


async def rpc(ws, frame):
    await ws.send(encode(frame))
    return decode(await asyncio.wait_for(ws.recv(), 10))


def abort(ws):
    ws.transport.abort()


def test_resent_tree_gets_the_stored_verdict(make_cloud):
    cloud = make_cloud()

    async def run():
        async with connect(cloud.url) as ws:
            ready = await rpc(ws, Hello([1, 2, 3]))
            v1 = await rpc(ws, Tree(0, [4, 5], [-1, 0]))
            entry = cloud.server.sessions.entry(ready.session)
            n = len(entry.session.tokens)
            forwards = entry.session.forwards
            again = await rpc(ws, Tree(0, [4, 5], [-1, 0]))
            assert again == v1 and len(entry.session.tokens) == n and entry.session.forwards == forwards
            other = await rpc(ws, Tree(0, [9], [-1]))
            assert isinstance(other, ErrorFrame) and other.code == "stale_round"
            assert isinstance(await rpc(ws, Tree(1, [], [])), VerdictFrame)
            old = await rpc(ws, Tree(0, [7], [-1]))  # older than the last round, not remembered as such
            assert isinstance(old, ErrorFrame) and old.code == "stale_round"

    asyncio.run(run())
    assert cloud.server.stats["replayed"] == 1


def test_resume_after_drop_continues_exactly(make_cloud, tiny_pair):
    target, _ = tiny_pair
    cloud = make_cloud(grace_s=5.0)
    prompt = [10, 20, 30]
    ref = reference_decode(target, prompt, 6, SamplingParams())

    async def run():
        ws = await connect(cloud.url)
        ready = await rpc(ws, Hello(prompt))
        committed = list(prompt)
        for r in range(3):
            v = await rpc(ws, Tree(r, [], []))
            committed.append(v.bonus)
        # the verdict of round 3 is lost: the cloud applied it, the edge never saw it
        await ws.send(encode(Tree(3, [], [])))
        await asyncio.sleep(0.2)
        abort(ws)
        await asyncio.sleep(0.1)
        assert len(cloud.server.sessions) == 1 and cloud.server.sessions.detached == 1
        async with connect(cloud.url) as ws2:
            again = await rpc(ws2, Hello(committed, session=ready.session))
            assert isinstance(again, Ready) and again.session == ready.session
            assert again.committed == len(committed) + 1  # one verdict ahead
            v = await rpc(ws2, Tree(3, [], []))  # re-sent: answered from the stored verdict
            committed.append(v.bonus)
            for r in (4, 5):
                committed.append((await rpc(ws2, Tree(r, [], []))).bonus)
            await ws2.send(encode(Bye()))
        return committed[len(prompt):]

    assert asyncio.run(run()) == ref
    assert cloud.server.stats["replayed"] == 1 and cloud.server.stats["resumed"] == 1


def test_unknown_session_is_reprefilled(make_cloud, tiny_pair):
    target, _ = tiny_pair
    cloud = make_cloud()
    prompt = [3, 1, 4, 1, 5]
    ref = reference_decode(target, prompt, 4, SamplingParams(temperature=1.0, seed=5), ())

    async def run():
        async with connect(cloud.url) as ws:
            ready = await rpc(ws, Hello(prompt + ref[:2], temperature=1.0, seed=5, session="feedfacecafebeef"))
            assert ready.session != "feedfacecafebeef" and ready.committed == len(prompt) + 2
            return [(await rpc(ws, Tree(r, [], []))).bonus for r in range(2)]

    assert asyncio.run(run()) == ref[2:]


def test_vanished_client_frees_kv_after_grace(make_cloud):
    cloud = make_cloud(grace_s=0.3)

    async def run():
        ws = await connect(cloud.url)
        await rpc(ws, Hello([1, 2]))
        abort(ws)
        await asyncio.sleep(0.1)
        assert len(cloud.server.sessions) == 1
        await asyncio.sleep(0.8)
        assert len(cloud.server.sessions) == 0

    asyncio.run(run())


def test_idle_session_is_freed_and_its_connection_closed_with_an_error_frame(make_cloud):
    cloud = make_cloud(idle_timeout_s=0.3)

    async def run():
        async with connect(cloud.url) as ws:
            ready = await rpc(ws, Hello([1, 2]))
            t0 = time.monotonic()
            err = decode(await asyncio.wait_for(ws.recv(), 5))  # unasked: the server speaks first
            assert isinstance(err, ErrorFrame) and err.code == "timeout" and ready.session in err.reason
            assert 0.25 < time.monotonic() - t0 < 3.0 and len(cloud.server.sessions) == 0
            with pytest.raises(websockets.ConnectionClosedOK):
                await asyncio.wait_for(ws.recv(), 5)
        async with connect(cloud.url) as ws:  # the edge's way back: Hello again on a new connection
            again = await rpc(ws, Hello([1, 2], session=ready.session))
            assert isinstance(again, Ready) and again.session != ready.session  # re-prefilled

    asyncio.run(run())
    assert 'rapid_connections_closed_total{reason="idle"} 1.0' in cloud.server.metrics.render().decode()


def test_a_resumed_sessions_old_connection_is_closed(make_cloud):
    cloud = make_cloud(grace_s=5.0)

    async def run():
        async with connect(cloud.url) as old, connect(cloud.url) as new:
            ready = await rpc(old, Hello([1, 2]))
            assert (await rpc(new, Hello([1, 2], session=ready.session))).session == ready.session
            moved = decode(await asyncio.wait_for(old.recv(), 5))
            assert isinstance(moved, ErrorFrame) and moved.code == "no_session" and "another connection" in moved.reason
            with pytest.raises(websockets.ConnectionClosedOK):
                await asyncio.wait_for(old.recv(), 5)
            assert isinstance(await rpc(new, Tree(0, [], [])), VerdictFrame)

    asyncio.run(run())


def test_detached_sessions_make_room_but_live_ones_give_full(make_cloud):
    cloud = make_cloud(max_sessions=2, grace_s=60)

    async def run():
        a = await connect(cloud.url)
        await rpc(a, Hello([1]))
        b = await connect(cloud.url)
        await rpc(b, Hello([1]))
        async with connect(cloud.url) as c:
            full = await rpc(c, Hello([1]))
            assert isinstance(full, ErrorFrame) and full.code == "full"
        abort(a)
        await asyncio.sleep(0.1)
        async with connect(cloud.url) as c:
            assert isinstance(await rpc(c, Hello([1])), Ready)  # evicts the detached session
        await b.close()

    asyncio.run(run())


@pytest.mark.parametrize("max_batch", [1, 4])
def test_crash_in_one_session_stays_there(tiny_pair, max_batch):
    target, _ = tiny_pair
    cloud = BackgroundServer(VerifierServer(target, max_batch=max_batch, batch_window_ms=20))
    ref = reference_decode(target, [7, 7], 3, SamplingParams())
    try:
        async def run():
            async with connect(cloud.url) as good, connect(cloud.url) as bad:
                await rpc(good, Hello([7, 7]))
                ready = await rpc(bad, Hello([8, 8]))
                session = cloud.server.sessions.get(ready.session)

                def boom(*a, **k):
                    raise RuntimeError("injected")

                session.verify = boom  # the batched path falls back to per-session verify on a crash
                session.model = None  # and the batched forward itself breaks on this row
                out = []
                for r in range(3):
                    await good.send(encode(Tree(r, [], [])))
                    await bad.send(encode(Tree(r, [1], [-1])))
                    out.append(decode(await good.recv()).bonus)
                    err = decode(await bad.recv())
                    assert isinstance(err, ErrorFrame) and err.code in ("internal", "bad_tree") and err.round == r
                return out

        assert asyncio.run(run()) == ref
    finally:
        cloud.close()
