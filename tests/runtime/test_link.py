"""rapid.runtime.link against a scripted websocket peer (no model): the handshake, the feedback
flag, verdict bookkeeping, error frames and the typed connection failures."""

from __future__ import annotations

import asyncio
import time

import pytest
from websockets.asyncio.server import serve

from rapid.core.errors import OptionError
from rapid.core.procs import free_port
from rapid.core.wire import Bye, ErrorFrame, Hello, Ready, Tree, VerdictFrame, decode, encode
from rapid.runtime.link import CloudError, CloudLink
from rapid.runtime.transcript import Transcript


def scripted(answer):
    """A peer that answers Hello with Ready and each Tree with ``answer(tree, committed)``."""
    seen: list = []

    async def handler(ws):
        committed = 0
        async for data in ws:
            frame = decode(data)
            seen.append(frame)
            if isinstance(frame, Hello):
                committed = len(frame.prompt)
                await ws.send(encode(Ready("s1", 100, 512, frame.max_nodes, committed)))
            elif isinstance(frame, Tree):
                reply = answer(frame, committed)
                if reply is None:  # a peer that never answers this tree
                    continue
                if isinstance(reply, VerdictFrame):
                    committed = reply.committed
                await ws.send(encode(reply))
            elif isinstance(frame, Bye):
                return

    return handler, seen


async def with_peer(answer, body):
    handler, seen = scripted(answer)
    port = free_port()
    async with serve(handler, "127.0.0.1", port):
        await body(f"ws://127.0.0.1:{port}")
    return seen


def accept_first(tree: Tree, committed: int) -> VerdictFrame:
    path = [0] if tree.tokens else []
    return VerdictFrame(tree.round, path, 42, committed + len(path) + 1)


def test_a_round_sets_feedback_and_the_next_verdict_must_fit_the_shared_transcript():
    async def body(url):
        link, transcript = CloudLink(url), Transcript.of([1, 2, 3])
        ready = await link.open(Hello([1, 2, 3], max_nodes=8), transcript)
        assert ready.session == "s1" and link.transcript is transcript
        await link.send_tree(0, [7, 8], [-1, 0])
        assert not link.feedback.is_set()
        verdict = await link.verdict(0)
        assert verdict.path == [0] and verdict.bonus == 42 and link.feedback.is_set()
        assert transcript.tokens == [1, 2, 3] and link.arrival(0) > 0  # the link reads, the caller commits
        transcript.commit([7, 42])
        await link.send_tree(1, [5], [-1])
        assert (await link.verdict(1)).committed == 7
        await link.send_tree(2, [5], [-1])  # round 2 uncommitted here: the cloud is ahead of us
        with pytest.raises(CloudError, match="does not fit"):
            await link.verdict(2)
        await link.close()
        await link.close()  # safe twice

    seen = asyncio.run(with_peer(accept_first, body))
    assert [type(f) for f in seen] == [Hello, Tree, Tree, Tree, Bye]


def test_an_error_frame_is_a_cloud_error():
    async def body(url):
        link = CloudLink(url)
        await link.open(Hello([1]))
        await link.send_tree(0, [5], [-1])
        with pytest.raises(CloudError) as e:
            await link.verdict(0)
        assert e.value.code == "bad_tree" and "node 0" in e.value.reason
        await link.close()

    asyncio.run(with_peer(lambda t, c: ErrorFrame("bad_tree", "node 0: nope", t.round), body))


def test_a_verdict_that_does_not_fit_is_a_protocol_error():
    async def body(url):
        link = CloudLink(url)
        await link.open(Hello([1]))
        await link.send_tree(0, [5], [-1])
        with pytest.raises(CloudError, match="does not fit"):
            await link.verdict(0)
        await link.close()

    asyncio.run(with_peer(lambda t, c: VerdictFrame(t.round, [0], 3, c + 7), body))


@pytest.mark.parametrize("reconnect", [True, False])
def test_nothing_listening_fails_fast_as_unreachable(reconnect):
    async def body():
        link = CloudLink(f"ws://127.0.0.1:{free_port()}", open_timeout=2.0, reconnect=reconnect)
        with pytest.raises(CloudError) as e:
            await link.open(Hello([1]))
        assert e.value.code == "unreachable" and "cannot connect" in e.value.reason

    asyncio.run(asyncio.wait_for(body(), 10))


def test_a_cloud_that_never_answers_hits_the_verdict_deadline():
    async def body(url):
        link = CloudLink(url, retry_timeout=0.2, verdict_timeout_s=1.0, backoff_s=0.01)
        await link.open(Hello([1], max_nodes=8))
        await link.send_tree(0, [5], [-1])
        t0 = time.monotonic()
        with pytest.raises(CloudError) as e:
            await link.verdict(0)
        assert e.value.code == "deadline" and "round 0" in e.value.reason
        assert 0.9 < time.monotonic() - t0 < 3.0
        assert link.stats["resent"] >= 1 and link.stats["reconnects"] >= 1  # it did try before giving up
        await link.close()

    asyncio.run(with_peer(lambda t, c: None, body))


def test_the_verdict_deadline_follows_the_slowest_round_between_floor_and_cap():
    async def body(url):
        link = CloudLink(url, verdict_timeout_s=120.0)
        assert link.verdict_deadline_s() == 30.0  # nothing measured yet: the floor
        await link.open(Hello([1], max_nodes=8))
        await link.send_tree(0, [5], [-1])
        await link.verdict(0)
        assert link.verdict_deadline_s() == 30.0  # a fast round: still the floor
        await link.close()

    asyncio.run(with_peer(accept_first, body))
    assert CloudLink("ws://127.0.0.1:1", verdict_timeout_s=1.0).verdict_deadline_s() == 1.0  # the cap rules
    for bad in ({"verdict_timeout_s": 0}, {"verdict_timeout_s": float("nan")}, {"retry_timeout": -1.0},
                {"retry_timeout": float("inf")}):  # nan passed the old `<= 0` guard and never timed out
        with pytest.raises(OptionError, match=f"{next(iter(bad))} must be a finite number > 0"):
            CloudLink("ws://127.0.0.1:1", **bad)


def test_a_full_cloud_is_retried_briefly_and_a_freed_slot_is_taken():
    """The peer is full for the first two Hellos, then has room: open() succeeds on a retry."""
    answers = [ErrorFrame("full", "at its limit of 1 sessions"), ErrorFrame("full", "at its limit of 1 sessions")]

    async def handler(ws):
        async for data in ws:
            frame = decode(data)
            if isinstance(frame, Hello):
                await ws.send(encode(answers.pop(0) if answers else Ready("s1", 100, 512, 8, len(frame.prompt))))

    async def run():
        port = free_port()
        async with serve(handler, "127.0.0.1", port):
            link = CloudLink(f"ws://127.0.0.1:{port}", backoff_s=0.01, full_retry_s=3.0)
            ready = await link.open(Hello([1, 2]))
            assert ready.session == "s1" and link.stats["reconnects"] == 2
            await link.close()

    asyncio.run(asyncio.wait_for(run(), 10))


@pytest.mark.parametrize("reconnect", [True, False])
def test_http_503_is_a_full_cloud_not_an_unreachable_one(reconnect):
    def refuse(connection, request):
        return connection.respond(503, "at its limit of 4 connections\n")

    async def run():
        port = free_port()
        async with serve(lambda ws: None, "127.0.0.1", port, process_request=refuse):
            link = CloudLink(f"ws://127.0.0.1:{port}", backoff_s=0.01, full_retry_s=0.5, reconnect=reconnect)
            t0 = time.monotonic()
            with pytest.raises(CloudError) as e:
                await link.open(Hello([1]))
            assert e.value.code == "full" and "HTTP 503" in e.value.reason
            assert time.monotonic() - t0 < 3.0

    asyncio.run(asyncio.wait_for(run(), 10))


def test_a_silent_connection_is_recovered_before_the_deadline():
    """Re-send and reconnect happen within thirds of the deadline, even with a long retry_timeout
    (a half-open connection used to run into the deadline with no reconnect: the chaos soak)."""
    answered = {"n": 0}

    def second_time(tree, committed):
        answered["n"] += 1
        return accept_first(tree, committed) if answered["n"] > 2 else None  # the first two copies vanish

    async def body(url):
        link = CloudLink(url, retry_timeout=30.0, verdict_timeout_s=3.0, backoff_s=0.01)
        await link.open(Hello([1], max_nodes=8))
        await link.send_tree(0, [5], [-1])
        verdict = await link.verdict(0)
        assert verdict.path == [0] and link.stats["resent"] >= 1 and link.stats["reconnects"] >= 1
        await link.close()

    asyncio.run(with_peer(second_time, body))
