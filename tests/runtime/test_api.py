"""rapid.runtime.api.Edge: the Python API against a real verifier on loopback (tiny models)."""

from __future__ import annotations

import asyncio

import pytest

from rapid.core.sampling import SamplingParams
from rapid.runtime.api import Edge
from rapid.runtime.tree import TreeParams
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.target import reference_decode, reference_scored


@pytest.fixture(scope="module")
def cloud_and_edge(tiny_pair, tiny_dir):
    target, _ = tiny_pair
    cloud = BackgroundServer(VerifierServer(target, token="api-token"))
    edge = Edge(cloud.url, draft=tiny_dir("target", seed=0, dtype="float64"), backend="torch", capacity=512,
                tree=TreeParams(3, 8, 2, 2), token="api-token")
    yield target, edge
    cloud.close()


def test_generate_is_the_target_alone(cloud_and_edge):
    target, edge = cloud_and_edge
    ids = list(edge.tokenizer("the python api")["input_ids"])
    out = edge.generate("the python api", max_tokens=20)
    want = reference_decode(target, ids, 20, SamplingParams(), edge.model.stop_ids)
    assert out.tokens == want and out.text == edge.tokenizer.decode(want, skip_special_tokens=True)
    sampled = edge.generate(ids, max_tokens=20, temperature=0.8, top_k=20, seed=3)
    assert sampled.tokens == reference_decode(target, ids, 20, SamplingParams(0.8, 1.0, 20, 3), edge.model.stop_ids)



def test_logprobs_are_the_target_alones(cloud_and_edge):
    target, edge = cloud_and_edge
    ids = list(edge.tokenizer("scored")["input_ids"])
    out = edge.generate(ids, max_tokens=12, temperature=0.7, top_p=0.9, seed=5, logprobs=3)
    want, scores = reference_scored(target, ids, 12, SamplingParams(0.7, 0.9, 0, 5), edge.model.stop_ids, logprobs=3)
    assert out.tokens == want and [s.token for s in out.scores] == want
    assert [s.logprob for s in out.scores] == scores.logprobs  # float32 values, bitwise
    assert [i for s in out.scores for i, _ in s.top] == scores.top_ids
    assert [lp for s in out.scores for _, lp in s.top] == scores.top_logprobs
    assert edge.generate(ids, max_tokens=4).scores == []  # not asked for: none


def test_stream_and_concurrent_calls(cloud_and_edge):
    target, edge = cloud_and_edge

    async def main():
        pieces = [p async for p in edge.stream("streamed", max_tokens=16)]
        a, b = await asyncio.gather(edge.agenerate("first", max_tokens=12), edge.agenerate("second", max_tokens=12))
        return pieces, a, b

    pieces, a, b = asyncio.run(main())
    assert "".join(pieces) == edge.generate("streamed", max_tokens=16).text  # random bytes: often one piece
    for prompt, got in (("first", a), ("second", b)):  # one engine: the calls took turns, both exact
        ids = list(edge.tokenizer(prompt)["input_ids"])
        assert got.tokens == reference_decode(target, ids, 12, SamplingParams(), edge.model.stop_ids)


def test_a_wrong_token_is_a_clear_error(cloud_and_edge, tiny_dir):
    from rapid.runtime.link import CloudError

    _, edge = cloud_and_edge
    bad = Edge(edge.cloud, draft=tiny_dir("target", seed=0, dtype="float64"), backend="torch", capacity=256,
               tree=TreeParams(3, 8, 2, 2), token="wrong")
    with pytest.raises(CloudError) as e:
        bad.generate("x", max_tokens=4)
    assert e.value.code == "unauthorized"
