"""``rapid edge`` through the official ``openai`` client: every parameter honoured exactly or
refused with 400 naming it, OpenAI-shaped errors with the right status, usage in its own final
stream chunk, readiness, and the daemon's flags as request defaults."""

from __future__ import annotations

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from edge_stack import Daemon, expected_text  # noqa: E402

from rapid.core.sampling import SamplingParams  # noqa: E402
from rapid.runtime.budget import default_max_tokens  # noqa: E402
from rapid.runtime.engine_pool import EdgeService  # noqa: E402
from rapid.runtime.generate import open_edge_model  # noqa: E402
from rapid.runtime.openai_schema import RequestDefaults  # noqa: E402
from rapid.runtime.tree import TreeParams  # noqa: E402

REFUSED_COMPLETION = [
    ("presence_penalty", {"presence_penalty": 0.5}), ("frequency_penalty", {"frequency_penalty": 0.5}),
    ("logit_bias", {"logit_bias": {"5": 3.0}}), ("echo", {"echo": True}),
    ("suffix", {"suffix": "tail"}), ("n", {"n": 2}), ("best_of", {"best_of": 3}),
]
REFUSED_CHAT = [
    ("tools", {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}),
    ("response_format", {"response_format": {"type": "json_object"}}), ("n", {"n": 3}),
    ("frequency_penalty", {"frequency_penalty": -1.0}),
]


@pytest.mark.parametrize("param, kw", REFUSED_COMPLETION)
def test_completion_parameters_we_cannot_honour_are_refused(stack, param, kw):
    client = stack[4]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", max_tokens=4, **kw)
    assert e.value.body["param"] == param and e.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize("param, kw", REFUSED_CHAT)
def test_chat_parameters_we_cannot_honour_are_refused(stack, param, kw):
    client = stack[4]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, **kw)
    assert e.value.body["param"] == param


def test_unknown_arguments_and_models(stack):
    client = stack[4]
    with pytest.raises(openai.BadRequestError, match="unrecognized request argument: foo"):
        client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body={"foo": 1})
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4o", prompt="x", max_tokens=2)
    assert e.value.body["code"] == "model_not_found"
    neutral = client.completions.create(model="tiny", prompt="x", max_tokens=2, temperature=0, user="u1",
                                        presence_penalty=0, logprobs=None)  # no effect on the output: accepted
    assert neutral.usage.completion_tokens == 2


@pytest.mark.parametrize("method, path, body, status", [
    ("POST", "/v1/chat/completions", {"messages": ["hi"]}, 400),
    ("POST", "/v1/chat/completions", {"messages": []}, 400),
    ("POST", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400),
    ("POST", "/v1/completions", {"prompt": [1, 2, 999999], "max_tokens": 2}, 400),
    ("POST", "/v1/completions", "not json", 400),
    ("GET", "/v1/completions", None, 405),
    ("GET", "/v1/nothing-here", None, 404),
])
def test_errors_have_the_openai_shape_and_status(stack, method, path, body, status):
    base = stack[3].base
    kw = {"content": body} if isinstance(body, str) else {"json": body} if body is not None else {}
    r = httpx.request(method, base + path, timeout=30, **kw)
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and "Traceback" not in err["message"]


def test_top_k_is_honoured_exactly(stack):
    target, tok, _, _, client = stack
    prompt = "sampled with top k"
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=16, temperature=0.9, top_p=1.0, seed=7,
                                  extra_body={"top_k": 5})
    ids = list(tok(prompt)["input_ids"])
    assert r.choices[0].text == expected_text(target, tok, ids, 16, SamplingParams(0.9, 1.0, 5, 7))[0]


def test_stream_usage_comes_in_its_own_final_chunk(stack):
    client = stack[4]
    chunks = list(client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=6, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 6
    assert chunks[-2].choices[0].finish_reason is not None and chunks[-2].usage is None
    assert all(c.usage is None for c in chunks[:-1])


def test_no_max_tokens_means_until_eos_or_the_context(stack):
    target, tok, _, _, client = stack
    prompt = "no limit given"
    r = client.completions.create(model="tiny", prompt=prompt, temperature=0)
    ids = list(tok(prompt)["input_ids"])
    room = default_max_tokens(1024, len(ids), TreeParams(3, 8, 2, 2))
    text, out = expected_text(target, tok, ids, room)
    assert r.choices[0].text == text and r.usage.completion_tokens == len(out) > 16
    assert r.choices[0].finish_reason == ("stop" if out[-1] == 256 else "length")


def test_a_prompt_over_the_context_is_a_400(stack):
    client = stack[4]
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt=[5] * 1100, max_tokens=8, temperature=0)
    assert e.value.body["code"] == "context_length_exceeded"


def test_health_follows_the_cloud_and_a_failed_stream_gets_its_status(stack, tiny_dir):
    base = stack[3].base
    assert httpx.get(base + "/health").status_code == 200 and httpx.get(base + "/livez").status_code == 200
    folder = tiny_dir("target", seed=0, dtype="float64")
    dead = EdgeService([open_edge_model(folder, "torch", 256)], "ws://127.0.0.1:9", model_name="tiny")
    daemon = Daemon(dead, RequestDefaults(max_tokens=4, temperature=0.0))
    try:
        r = httpx.get(daemon.base + "/health")
        assert r.status_code == 503 and "unreachable" in r.json()["reason"]
        assert httpx.get(daemon.base + "/livez").status_code == 200
        client = openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as e:
            list(client.completions.create(model="tiny", prompt="x", stream=True))
        assert e.value.status_code == 502  # before the first token: the status, not 200 + an error event
        metrics = httpx.get(daemon.base + "/metrics").text
        assert 'rapid_edge_requests_total{endpoint="completions",status="502"} 1.0' in metrics
    finally:
        daemon.close()


def test_metrics_have_latency_tokens_process_and_per_engine_gauges(stack):
    client, base = stack[4], stack[3].base
    client.completions.create(model="tiny", prompt="count me", max_tokens=5, temperature=0)
    text = httpx.get(base + "/metrics").text
    for name in ("rapid_edge_time_to_first_token_seconds_count", "rapid_edge_e2e_request_latency_seconds_count",
                 "rapid_edge_prompt_tokens_total", "process_resident_memory_bytes", 'rapid_edge_esr{engine="'):
        assert name in text, name
    counts = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
              if line.startswith(("rapid_edge_time_per_output_token_seconds_count",
                                  "rapid_edge_time_to_first_token_seconds_count"))}
    assert counts["rapid_edge_time_per_output_token_seconds_count"] >= 1  # 5 tokens: four after the first
    assert counts["rapid_edge_time_per_output_token_seconds_count"] <= counts["rapid_edge_time_to_first_token_seconds_count"]
    assert "_created" not in text
