"""Bad input over a real websocket: an error frame with a reason, the server stays up, other
sessions are untouched."""

from __future__ import annotations

import asyncio

import msgpack
import pytest
from websockets.asyncio.client import connect

from rapid.core.sampling import SamplingParams
from rapid.core.wire import (
    MAX_ARRAY,
    MAX_FRAME_BYTES,
    ErrorFrame,
    Hello,
    Ready,
    Tree,
    VerdictFrame,
    decode,
    encode,
)
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.serve_config import Limits
from rapid.server.target import reference_decode


@pytest.fixture(scope="module")
def cloud(tiny_pair):
    target, _ = tiny_pair
    server = BackgroundServer(VerifierServer(target, Limits(max_sessions=3, max_context=64, max_nodes=8)))
    yield server
    server.close()


async def _exchange(url, frames):
    """Send raw frames one by one on one connection; return the decoded replies."""
    replies = []
    async with connect(url) as ws:
        for f in frames:
            await ws.send(f)
            replies.append(decode(await ws.recv()))
    return replies


def exchange(url, *frames):
    return asyncio.run(_exchange(url, [f if isinstance(f, (bytes, str)) else encode(f) for f in frames]))


def test_good_session_survives_neighbours_errors(cloud, tiny_pair):
    target, _ = tiny_pair
    prompt = [1, 2, 3, 4]
    ref = reference_decode(target, prompt, 3, SamplingParams())

    async def good_and_bad():
        async with connect(cloud.url) as good:
            await good.send(encode(Hello(prompt)))
            assert isinstance(decode(await good.recv()), Ready)
            # a neighbour misbehaves in every way while the good session is open
            await _exchange(cloud.url, [b"\x00garbage", encode(Tree(0, [5], [3]))])
            out = []
            for r in range(3):
                await good.send(encode(Tree(r, [], [])))
                v = decode(await good.recv())
                assert isinstance(v, VerdictFrame)
                out.append(v.bonus)
            return out

    assert asyncio.run(good_and_bad()) == ref


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        (b"\xc1\xc1", "bad_frame"),
        ("a text frame", "bad_frame"),
        (msgpack.packb({"t": "hello", "v": 99, "prompt": b"\x01\x00\x00\x00"}), "bad_version"),
        (msgpack.packb({"t": "warp"}), "unknown_type"),
        (msgpack.packb({"t": "tree", "round": 0, "tokens": b"\x01\x00\x00", "parents": b""}), "bad_frame"),
        (msgpack.packb([1, 2, 3]), "bad_frame"),
    ],
)
def test_malformed_frames_get_error_frames(cloud, frame, code):
    (reply,) = exchange(cloud.url, frame)
    assert isinstance(reply, ErrorFrame) and reply.code == code and reply.reason


@pytest.mark.parametrize(
    ("tokens", "parents", "needle"),
    [
        ([5, 6], [-1, 5], "parent 5"),  # out of range
        ([5, 6], [1, 0], "parent 1"),  # forward reference: would be a cycle
        ([5], [-2], "parent -2"),
        ([9999], [-1], "outside the vocabulary"),
        ([1] * 9, [-1] * 9, "session limit"),
        ([1, 2], [-1], "2 tokens but 1 parents"),
    ],
)
def test_bad_trees_get_error_frames_and_session_continues(cloud, tokens, parents, needle):
    ready, err, ok = exchange(cloud.url, Hello([1, 2, 3]), Tree(0, tokens, parents), Tree(1, [], []))
    assert isinstance(ready, Ready)
    assert isinstance(err, ErrorFrame) and err.code == "bad_tree" and needle in err.reason and err.round == 0
    assert isinstance(ok, VerdictFrame) and ok.round == 1


def test_a_frame_over_the_protocol_limit_gets_an_error_frame_and_the_connection_stays(cloud):
    too_big = msgpack.packb({"t": "tree", "round": 0, "tokens": b"\x00" * MAX_FRAME_BYTES, "parents": b""})
    err, ready, verdict = exchange(cloud.url, too_big, Hello([1, 2]), Tree(0, [], []))
    assert isinstance(err, ErrorFrame) and err.code == "too_large" and str(MAX_FRAME_BYTES) in err.reason
    assert isinstance(ready, Ready) and isinstance(verdict, VerdictFrame)


def test_a_tree_at_the_array_maximum_reaches_the_tree_checks(cloud):
    """The documented maximum frame crosses the transport: the session's node limit answers it."""
    ready, err = exchange(cloud.url, Hello([1, 2]), Tree(0, [1] * MAX_ARRAY, [-1] * MAX_ARRAY))
    assert isinstance(ready, Ready)
    assert isinstance(err, ErrorFrame) and err.code == "bad_tree" and "session limit" in err.reason


def test_prompt_longer_than_context(cloud):
    (reply,) = exchange(cloud.url, Hello(list(range(100))))
    assert isinstance(reply, ErrorFrame) and reply.code == "context" and "context" in reply.reason


def test_tree_before_hello_and_double_hello(cloud):
    (r1,) = exchange(cloud.url, Tree(0, [], []))
    assert isinstance(r1, ErrorFrame) and r1.code == "no_session"
    _, r2 = exchange(cloud.url, Hello([1]), Hello([1]))
    assert isinstance(r2, ErrorFrame) and r2.code == "bad_state"


def test_session_limit_gives_full_and_frees_on_close(cloud):
    async def run():
        conns = [await connect(cloud.url) for _ in range(3)]
        for c in conns:
            await c.send(encode(Hello([1, 2])))
            assert isinstance(decode(await c.recv()), Ready)
        (full,) = await _exchange(cloud.url, [encode(Hello([1, 2]))])
        assert isinstance(full, ErrorFrame) and full.code == "full" and "limit of 3 sessions" in full.reason
        await conns[0].close()
        await asyncio.sleep(0.2)
        (ok,) = await _exchange(cloud.url, [encode(Hello([1, 2]))])
        assert isinstance(ok, Ready)
        for c in conns[1:]:
            await c.close()

    asyncio.run(run())
