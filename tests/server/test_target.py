"""rapid.server.target: tree verification emits exactly what the target alone emits."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM

from rapid.core.errors import RapidError
from rapid.core.sampling import SamplingParams
from rapid.modeling import Decoder
from rapid.server.target import BadTreeError, TargetSession, reference_decode
from rapid.tiny import VOCAB, build_tiny

REF_LEN = 24  # reference tokens per example
MAX_TREE = 8  # so one verdict emits at most 9 tokens
STOP_AT = REF_LEN - MAX_TREE - 1  # keep driving rounds while fewer tokens were emitted


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = build_tiny(tmp_path_factory.mktemp("target_tiny") / "t", seed=0, dtype="float64")
    return Decoder.from_hf(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64))


PARAMS = {
    "greedy": SamplingParams(),
    "t0.9": SamplingParams(temperature=0.9, seed=1234),
    "t1.3-topk-topp": SamplingParams(temperature=1.3, top_k=40, top_p=0.9, seed=2**40 + 7),
}


def make_tree(rng: np.random.Generator, kind: str, truth: list[int]):
    """tokens, parents and the number of chain nodes that carry the true continuation.

    kind "true": a chain of the next m true tokens mixed with noise nodes that never duplicate
    the true token under a chain node; "wrong": random tokens; "empty": no nodes.
    """
    if kind == "empty":
        return [], [], 0
    n = int(rng.integers(1, MAX_TREE + 1))
    if kind == "wrong":
        parents = [int(rng.integers(-1, j)) if j else -1 for j in range(n)]
        return rng.integers(0, VOCAB, size=n).tolist(), parents, 0
    m = int(rng.integers(0, min(n, len(truth)) + 1))
    chain_at = sorted(rng.choice(n, size=m, replace=False).tolist())
    tokens, parents, chain_nodes = [], [], []
    for j in range(n):
        if j in chain_at:
            k = len(chain_nodes)
            tokens.append(truth[k])
            parents.append(chain_nodes[-1] if chain_nodes else -1)
            chain_nodes.append(j)
        else:
            p = int(rng.integers(-1, j)) if j else -1
            tok = int(rng.integers(0, VOCAB))
            # under a chain node (or the root) a noise sibling must not carry the true token
            depth = 0 if p == -1 else (chain_nodes.index(p) + 1 if p in chain_nodes else None)
            if depth is not None and depth < len(truth) and tok == truth[depth]:
                tok = (tok + 1) % VOCAB
            tokens.append(tok)
            parents.append(p)
    return tokens, parents, m


@pytest.mark.parametrize("name", sorted(PARAMS))
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), prompt_len=st.integers(1, 8))
def test_verify_emits_exactly_the_reference(model, name, seed, prompt_len):
    params = PARAMS[name]
    rng = np.random.default_rng(seed)
    prompt = rng.integers(0, VOCAB, size=prompt_len).tolist()
    ref = reference_decode(model, prompt, REF_LEN, params)
    assert len(ref) == REF_LEN

    session = TargetSession(model, prompt, params, capacity=64, max_nodes=MAX_TREE)
    out: list[int] = []
    rounds = 0
    while len(out) < STOP_AT:
        kind = ["true", "true", "wrong", "empty"][int(rng.integers(0, 4))]
        tokens, parents, m = make_tree(rng, kind, ref[len(out):])
        verdict = session.verify(tokens, parents)
        rounds += 1
        emitted = [tokens[j] for j in verdict.path] + [verdict.bonus]
        assert verdict.emitted == len(emitted)
        if kind == "true":
            assert len(verdict.path) >= m  # the true chain is always accepted in full
        out += emitted
        assert out == ref[:len(out)]
        assert session.tokens == prompt + out
        assert session.kv.length == len(session.tokens) - 1
    assert session.forwards == rounds + (1 if prompt_len > 1 else 0)


def test_true_chain_is_fully_accepted_in_one_forward(model):
    params = PARAMS["greedy"]
    prompt = [10, 20, 30]
    ref = reference_decode(model, prompt, 9, params)
    session = TargetSession(model, prompt, params, max_nodes=MAX_TREE)
    before = session.forwards
    verdict = session.verify(ref[:8], [-1, 0, 1, 2, 3, 4, 5, 6])
    assert verdict.path == tuple(range(8)) and verdict.bonus == ref[8]
    assert session.forwards == before + 1
    assert session.tokens == prompt + ref


@pytest.mark.parametrize("tokens,parents", [
    ([1, 2], [-1, 1]),  # self reference
    ([1, 2, 3], [-1, 2, 0]),  # forward reference
    ([1, 2], [-1, 5]),
    ([1, VOCAB], [-1, 0]),  # outside the vocabulary
    ([-1], [-1]),
    ([1, 2, 3], [-1, 0]),  # length mismatch
    (list(range(MAX_TREE + 1)), [-1] * (MAX_TREE + 1)),  # too many nodes
])
def test_bad_trees_raise_and_leave_the_session_unchanged(model, tokens, parents):
    session = TargetSession(model, [1, 2, 3], PARAMS["greedy"], max_nodes=MAX_TREE)
    state = (list(session.tokens), session.kv.length, session.forwards)
    with pytest.raises(BadTreeError) as e:
        session.verify(tokens, parents)
    assert isinstance(e.value, RapidError)
    assert (session.tokens, session.kv.length, session.forwards) == state
    # the session still works and agrees with the reference
    bonus = session.verify([], []).bonus
    assert bonus == reference_decode(model, [1, 2, 3], 1, PARAMS["greedy"])[0]


def test_prompt_checks(model):
    params = PARAMS["greedy"]
    with pytest.raises(BadTreeError):
        TargetSession(model, list(range(10)), params, capacity=10)  # longer than the context
    with pytest.raises(BadTreeError):
        TargetSession(model, list(range(20)), params, capacity=10)
    TargetSession(model, list(range(10)), params, capacity=11)
    with pytest.raises(BadTreeError):
        TargetSession(model, [], params)
    with pytest.raises(BadTreeError):
        TargetSession(model, [1, VOCAB], params)
    with pytest.raises(BadTreeError):
        TargetSession(model, [-3, 1], params)


def test_context_full_is_a_bad_tree_and_committed_never_exceeds_capacity(model):
    params = PARAMS["greedy"]
    capacity = 12
    session = TargetSession(model, [1, 2, 3, 4], params, capacity=capacity)
    assert session.capacity == capacity
    with pytest.raises(BadTreeError):
        session.verify([5] * 10, list(range(-1, 9)))  # a chain far too long for the room left
    assert session.tokens == [1, 2, 3, 4] and session.kv.length == 3
    fits = capacity - len(session.tokens) - 1  # tree + bonus fill the context exactly
    session.verify([7] * fits, list(range(-1, fits - 1)))
    while True:
        try:
            session.verify([], [])
        except BadTreeError:
            break
        assert len(session.tokens) <= capacity
    assert len(session.tokens) <= capacity and session.kv.length == len(session.tokens) - 1


def test_reference_decode_stops_at_stop_token(model):
    params = PARAMS["t0.9"]
    prompt = [3, 1, 4, 1, 5]
    free = reference_decode(model, prompt, 20, params)
    stop = free[7]
    first = free.index(stop)
    assert reference_decode(model, prompt, 20, params, stop_ids=(stop,)) == free[:first + 1]
    assert reference_decode(model, prompt, 5, params) == free[:5]


def test_chain_job_layout(model):
    """[root] + nodes: positions from the depths; one chain per root-to-leaf path."""
    session = TargetSession(model, [5, 6, 7, 8], SamplingParams())
    job = session.chain_job([1, 2, 3, 4, 5], [-1, 0, -1, 1, 0])
    assert job.ids == [8, 1, 2, 3, 4, 5] and job.positions == [3, 4, 5, 4, 6, 5]
    assert job.chains == [[0, 3], [0, 1, 2, 4], [0, 1, 5]]  # leaves 2, 3, 4 (rows 3, 4, 5)
    assert job.kv is session.kv and session.kv.length == 3  # the prompt minus its last token (the root)
