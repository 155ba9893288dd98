"""``rapid edge`` through the official ``openai`` client: log-probabilities (exactly the cloud's,
which are the target's: compared with target-only decoding), stream and non-stream, stop
strings dropping their tokens' scores, OpenAI's limits; ``--api-key``; the default max_tokens
clamped to the cloud's context."""

from __future__ import annotations

import argparse

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from edge_stack import TOKEN, Daemon, expected_text  # noqa: E402

from rapid.core.sampling import SamplingParams  # noqa: E402
from rapid.runtime.daemon import api_key_of  # noqa: E402
from rapid.runtime.engine_pool import EdgeService  # noqa: E402
from rapid.runtime.generate import open_edge_model  # noqa: E402
from rapid.runtime.tree import TreeParams  # noqa: E402
from rapid.server.app import VerifierServer  # noqa: E402
from rapid.server.background import BackgroundServer  # noqa: E402
from rapid.server.serve_config import Limits  # noqa: E402
from rapid.server.target import reference_scored  # noqa: E402

CHAT = [{"role": "user", "content": "say something"}]


def _reference(stack, ids, max_tokens, k, sampling=None):
    target = stack[0]
    return reference_scored(target, ids, max_tokens, sampling or SamplingParams(), (256,), logprobs=k)


def test_completion_logprobs_are_the_targets(stack):
    target, tok, _, _, client = stack
    prompt = "def add(a, b):"
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, logprobs=3)
    ids = list(tok(prompt)["input_ids"])
    out, ref = _reference(stack, ids, 12, 3)
    lp = r.choices[0].logprobs
    assert lp.token_logprobs == ref.logprobs and len(lp.tokens) == len(out) == r.usage.completion_tokens
    for i, top in enumerate(lp.top_logprobs):  # the top 3 (+ the chosen token); names may collide (U+FFFD)
        names = [tok.decode([t]) for t in ref.top_ids[3 * i:3 * i + 3]]
        for name, v in zip(names, ref.top_logprobs[3 * i:3 * i + 3], strict=True):
            assert names.count(name) > 1 or top[name] == v
        assert tok.decode([out[i]]) in top and len(top) <= 4
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(o <= len(r.choices[0].text) for o in lp.text_offset)


def test_chat_logprobs_stream_and_whole_agree_and_match_the_target(stack):
    _, tok, _, _, client = stack
    kw = dict(model="tiny", messages=CHAT, max_tokens=10, temperature=0.9, seed=7, logprobs=True, top_logprobs=2)
    whole = client.chat.completions.create(**kw)
    content = whole.choices[0].logprobs.content
    ids = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    out, ref = _reference(stack, ids, 10, 2, SamplingParams(0.9, 1.0, 0, 7))
    assert [c.logprob for c in content] == ref.logprobs and len(content) == len(out)
    assert [[t.logprob for t in c.top_logprobs] for c in content] == [ref.top_logprobs[2 * i:2 * i + 2]
                                                                     for i in range(len(out))]
    assert [c.bytes for c in content] == [[t] if t < 256 else list(tok.decode([t]).encode()) for t in out]
    streamed = [c for ch in client.chat.completions.create(stream=True, **kw) if ch.choices
                and ch.choices[0].logprobs for c in ch.choices[0].logprobs.content]
    assert [(c.token, c.logprob, c.bytes) for c in streamed] == [(c.token, c.logprob, c.bytes) for c in content]


def test_completion_stream_carries_the_same_logprobs(stack):
    client = stack[4]
    kw = dict(model="tiny", prompt="stream me", max_tokens=9, temperature=0, logprobs=1)
    whole = client.completions.create(**kw).choices[0].logprobs
    parts = [c.choices[0].logprobs for c in client.completions.create(stream=True, **kw)
             if c.choices and c.choices[0].logprobs]
    assert [v for p in parts for v in p.token_logprobs] == whole.token_logprobs
    assert [v for p in parts for v in p.text_offset] == whole.text_offset


def test_tokens_cut_by_a_stop_string_lose_their_logprobs(stack):
    target, tok, _, _, client = stack
    prompt = "stop here"
    ids = list(tok(prompt)["input_ids"])
    full, out = expected_text(target, tok, ids, 30)
    stop = next((full[i:i + 2] for i in range(3, len(full) - 2) if full[i:i + 2].isprintable()), None)
    if stop is None:
        pytest.skip("the tiny model's text has no printable pair to stop at")
    for stream in (False, True):
        kw = dict(model="tiny", prompt=prompt, max_tokens=30, temperature=0, logprobs=0, stop=[stop])
        if stream:
            chunks = [c.choices[0] for c in client.completions.create(stream=True, **kw) if c.choices]
            text = "".join(c.text for c in chunks)
            offsets = [o for c in chunks if c.logprobs for o in c.logprobs.text_offset]
        else:
            choice = client.completions.create(**kw).choices[0]
            text, offsets = choice.text, choice.logprobs.text_offset
        assert text == full[:full.index(stop)]
        assert offsets and all(o < len(text) for o in offsets) and len(offsets) < len(out)


@pytest.mark.parametrize("chat, kw, param", [
    (False, {"logprobs": 6}, "logprobs"), (False, {"logprobs": -1}, "logprobs"),
    (True, {"logprobs": True, "top_logprobs": 21}, "top_logprobs"), (True, {"top_logprobs": 2}, "top_logprobs"),
])
def test_logprob_limits_are_400s_naming_the_parameter(stack, chat, kw, param):
    client = stack[4]
    with pytest.raises(openai.BadRequestError) as e:
        if chat:
            client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2, **kw)
        else:
            client.completions.create(model="tiny", prompt="x", max_tokens=2, **kw)
    assert e.value.body["param"] == param


def test_no_logprobs_asked_gives_null(stack):
    r = stack[4].completions.create(model="tiny", prompt="plain", max_tokens=3, temperature=0)
    assert r.choices[0].logprobs is None


def test_api_key_guards_v1_and_leaves_health_open(stack, tiny_dir):
    folder = tiny_dir("target", seed=0, dtype="float64")
    service = EdgeService([open_edge_model(folder, "torch", 256)], stack[2].url, token=TOKEN,
                          tree=TreeParams(3, 8, 2, 2), model_name="tiny")
    daemon = Daemon(service, api_key="s3cret")
    try:
        good = openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="s3cret", max_retries=0)
        assert good.completions.create(model="tiny", prompt="hi", max_tokens=2, temperature=0).choices[0].text is not None
        assert good.models.list().data[0].id == "tiny"
        bad = openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as e:
            bad.chat.completions.create(model="tiny", messages=CHAT, max_tokens=2)
        assert e.value.body["code"] == "invalid_api_key"
        r = httpx.post(daemon.base + "/v1/completions", json={"prompt": "x"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        for path in ("/health", "/livez", "/metrics"):
            assert httpx.get(daemon.base + path).status_code == 200, path
    finally:
        daemon.close()


def test_api_key_flag_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("RAPID_API_KEY", "from-env")
    assert api_key_of(argparse.Namespace(api_key="from-flag")) == "from-flag"
    assert api_key_of(argparse.Namespace(api_key=None)) == "from-env"
    monkeypatch.delenv("RAPID_API_KEY")
    assert api_key_of(argparse.Namespace(api_key=None)) is None


def test_default_max_tokens_is_clamped_to_the_clouds_context(tiny_pair, tiny_dir):
    """Edge context 1024, cloud context 64: no max_tokens → until EOS or 64 − prompt − tree
    budget; an explicit max_tokens that does not fit the cloud stays a 400."""
    target, _ = tiny_pair
    cloud = BackgroundServer(VerifierServer(target, Limits(max_context=64)))
    folder = tiny_dir("target", seed=0, dtype="float64")
    service = EdgeService([open_edge_model(folder, "torch", 1024)], cloud.url, tree=TreeParams(3, 8, 2, 2),
                          model_name="tiny")
    daemon = Daemon(service)
    try:
        client = openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="x", max_retries=0)
        prompt = "clamp me"
        ids = list(service.tokenizer(prompt)["input_ids"])
        r = client.completions.create(model="tiny", prompt=prompt, temperature=0)
        text, out = expected_text(target, service.tokenizer, ids, 64 - len(ids) - 8)
        assert r.choices[0].text == text and r.usage.completion_tokens == len(out)
        assert r.choices[0].finish_reason == ("stop" if out[-1] == 256 else "length")
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="tiny", prompt=prompt, max_tokens=100, temperature=0)
        assert e.value.body["code"] == "context_length_exceeded"
    finally:
        daemon.close()
        cloud.close()
