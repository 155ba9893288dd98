"""The tokenizer fingerprint both sides compare at the handshake (rapid.core.vocab, rapid.core.wire)."""

from __future__ import annotations

import asyncio

import pytest
from transformers import AutoTokenizer
from websockets.asyncio.server import serve

from rapid.core.vocab import fingerprint
from rapid.core.wire import Hello, Ready, decode, encode
from rapid.runtime.link import CloudError, CloudLink
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.tiny import write_tokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vocab_tok")
    write_tokenizer(folder)
    return AutoTokenizer.from_pretrained(folder)


def test_fingerprint_is_stable_and_sees_a_changed_vocabulary(tok, tmp_path_factory):
    same = AutoTokenizer.from_pretrained(tok.name_or_path)
    assert fingerprint(tok) == fingerprint(same) and len(fingerprint(tok)) == 16
    same.add_tokens(["<|a_new_token|>"])
    assert fingerprint(same) != fingerprint(tok)


def test_the_fields_round_trip_and_default_to_unknown():
    assert decode(encode(Hello([1, 2], tokenizer="abc"))).tokenizer == "abc"
    assert decode(encode(Ready("s", 10, 64, 8, 2, 4, "def"))).tokenizer == "def"
    assert decode(encode(Hello([1]))).tokenizer == ""


def test_a_mismatch_is_refused_on_either_side(tiny_pair, tok):
    target, _ = tiny_pair
    mine = fingerprint(tok)
    checking = BackgroundServer(VerifierServer(target, tokenizer=mine))
    try:
        async def open_with(fp: str, url: str):
            link = CloudLink(url, tokenizer=fp, reconnect=False)
            try:
                return await link.open(Hello([1, 2, 3]))
            finally:
                await link.close()

        assert asyncio.run(open_with(mine, checking.url)).tokenizer == mine  # same family: fine
        with pytest.raises(CloudError) as e:  # the cloud refuses (it checks the Hello)
            asyncio.run(open_with("0" * 16, checking.url))
        assert e.value.code == "incompatible" and "target's family" in e.value.reason
        assert asyncio.run(open_with("", checking.url)).session  # an edge that does not say: not checked
    finally:
        checking.close()


def test_the_edge_refuses_a_ready_of_another_tokenizer(tok):
    """A cloud that does not check Hellos (an older one): the edge still compares Ready's."""
    seen = []

    async def peer(ws):
        async for data in ws:
            frame = decode(data)
            seen.append(frame)
            if isinstance(frame, Hello):
                await ws.send(encode(Ready("s1", 300, 256, 8, len(frame.prompt), 0, "f" * 16)))

    async def main():
        async with serve(peer, "127.0.0.1", 0) as srv:
            url = f"ws://127.0.0.1:{srv.sockets[0].getsockname()[1]}"
            link = CloudLink(url, tokenizer=fingerprint(tok), reconnect=False)
            with pytest.raises(CloudError, match="another tokenizer") as e:
                await link.open(Hello([1, 2, 3]))
            await link.close()
            return e.value.code

    assert asyncio.run(main()) == "incompatible"
    assert seen[0].tokenizer == fingerprint(tok)  # the Hello carried the edge's fingerprint
