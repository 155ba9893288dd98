"""Connection admission and lifetimes over a real websocket: the pre-Hello deadline, the cap on
open connections (HTTP 503), their metrics, and what the edge's link makes of a full cloud."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest
import websockets
from websockets.asyncio.client import connect
from websockets.protocol import State

from rapid.core.wire import ErrorFrame, Hello, Ready, Tree, VerdictFrame, decode, encode
from rapid.runtime.link import FULL_RETRY_S, CloudError, CloudLink
from rapid.server.connections import ConnectionGate


def metric(cloud, name: str) -> float:
    text = urllib.request.urlopen(cloud.url.replace("ws://", "http://") + "/metrics", timeout=5).read().decode()
    return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name + " ")))


async def closed_after_timeout_frame(ws) -> ErrorFrame:
    err = decode(await asyncio.wait_for(ws.recv(), 5))
    with pytest.raises(websockets.ConnectionClosed) as e:
        await asyncio.wait_for(ws.recv(), 5)
    assert e.value.rcvd is not None and e.value.rcvd.code == 1008
    return err


class Conn:
    def __init__(self) -> None:
        self.state = State.OPEN


def test_gate_counts_admitted_connections_until_released_or_closed():
    gate = ConnectionGate(2)
    a, b, c = Conn(), Conn(), Conn()
    assert gate.admit(a) and gate.admit(a) and gate.admit(b) and not gate.admit(c) and gate.open == 2
    gate.release(a)
    assert gate.admit(c) and not gate.admit(a)
    b.state = State.CLOSED  # a handshake that failed after admission: its handler never releases it
    assert gate.open == 1 and gate.admit(a)
    with pytest.raises(ValueError):
        ConnectionGate(0)


@pytest.mark.parametrize("chatter", [[], [b"\x00garbage", encode(Tree(0, [], []))]])
def test_a_connection_without_a_session_is_closed_at_the_hello_deadline(make_cloud, chatter):
    cloud = make_cloud(hello_timeout_s=0.4)

    async def run():
        async with connect(cloud.url) as ws:
            t0 = time.monotonic()
            for frame in chatter:  # frames that are not a successful Hello do not extend the deadline
                await ws.send(frame)
                assert isinstance(decode(await ws.recv()), ErrorFrame)
            err = await closed_after_timeout_frame(ws)
            assert err.code == "timeout" and "hello" in err.reason and 0.35 < time.monotonic() - t0 < 3.0

    asyncio.run(run())
    assert cloud.server.metrics.connections_closed.labels("hello_timeout")._value.get() == 1
    assert metric(cloud, "rapid_connections_open") == 0


def test_a_connection_with_a_session_has_no_hello_deadline(make_cloud):
    cloud = make_cloud(hello_timeout_s=0.3)

    async def run():
        async with connect(cloud.url) as ws:
            await ws.send(encode(Hello([1, 2])))
            assert isinstance(decode(await ws.recv()), Ready)
            await asyncio.sleep(0.8)
            await ws.send(encode(Tree(0, [], [])))
            assert isinstance(decode(await asyncio.wait_for(ws.recv(), 5)), VerdictFrame)

    asyncio.run(run())


def test_connections_beyond_the_cap_get_503_and_a_freed_slot_is_reused(make_cloud):
    cloud = make_cloud(max_sessions=1, max_connections=2, hello_timeout_s=30)

    async def run():
        held = [await connect(cloud.url) for _ in range(2)]  # silent: no session, not yet timed out
        assert metric(cloud, "rapid_connections_open") == 2
        with pytest.raises(websockets.InvalidStatus) as e:
            async with connect(cloud.url):
                pass
        assert e.value.response.status_code == 503 and b"limit of 2 connections" in e.value.response.body
        health = urllib.request.urlopen(cloud.url.replace("ws://", "http://") + "/health", timeout=5)
        assert health.read() == b"ok\n"  # plain HTTP is not a websocket connection: still answered
        await held[0].close()
        await asyncio.sleep(0.1)
        async with connect(cloud.url) as ws:
            await ws.send(encode(Hello([1])))
            assert isinstance(decode(await ws.recv()), Ready)
        await held[1].close()

    asyncio.run(run())
    assert metric(cloud, "rapid_connections_refused_total") == 1


@pytest.mark.parametrize("limits", [dict(max_sessions=1), dict(max_sessions=1, max_connections=1)])
def test_a_full_cloud_fails_the_links_open_quickly_with_code_full(make_cloud, limits):
    """One session held: a second link's open() is told "full" (ErrorFrame at the session limit, or
    HTTP 503 at the connection limit), retries for FULL_RETRY_S at most, and says the cloud is full."""
    cloud = make_cloud(**limits)

    async def run():
        holder = CloudLink(cloud.url)
        await holder.open(Hello([1, 2]))
        second = CloudLink(cloud.url, max_retry_s=60.0)
        t0 = time.monotonic()
        with pytest.raises(CloudError) as e:
            await second.open(Hello([3]))
        took = time.monotonic() - t0
        await asyncio.sleep(0.2)
        assert cloud.server.gate.open == 1  # the failed link left no connection open on the cloud
        await holder.close()
        return e.value, took

    err, took = asyncio.run(run())
    assert err.code == "full" and "full" in err.reason and "unreachable" not in str(err)
    assert FULL_RETRY_S <= took < FULL_RETRY_S + 3.0
