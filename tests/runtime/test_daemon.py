"""``rapid edge``: the OpenAI-compatible daemon, driven by the real ``openai`` client on loopback.

Tiny models: the draft folder is the target checkpoint itself (loaded float32 by the edge), the
cloud verifies with the float64 target, so every answer must equal target-only decoding.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")
uvicorn = pytest.importorskip("uvicorn")

from edge_stack import TOKEN, Daemon, expected_text  # noqa: E402

from rapid.core.procs import free_port  # noqa: E402
from rapid.core.sampling import SamplingParams  # noqa: E402
from rapid.runtime.engine_pool import EdgeService  # noqa: E402
from rapid.runtime.generate import open_edge_model  # noqa: E402
from rapid.runtime.tree import TreeParams  # noqa: E402
from rapid.server.app import VerifierServer  # noqa: E402
from rapid.server.background import BackgroundServer  # noqa: E402
from rapid.server.serve_config import Limits  # noqa: E402
from rapid.server.target import reference_decode  # noqa: E402


def test_models_health_metrics(stack):
    _, _, _, daemon, client = stack
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert b'"ok"' in urllib.request.urlopen(f"{daemon.base}/health").read()
    text = urllib.request.urlopen(f"{daemon.base}/metrics").read().decode()
    assert "rapid_edge_draft_step_seconds" in text and "rapid_edge_esr" in text


def test_completion_greedy_is_exact(stack):
    target, tok, _, _, client = stack
    r = client.completions.create(model="tiny", prompt="def add(a, b):", max_tokens=24, temperature=0)
    want, ids = expected_text(target, tok, list(tok("def add(a, b):")["input_ids"]), 24)
    assert r.choices[0].text == want
    assert r.usage.completion_tokens == len(ids) and r.choices[0].finish_reason in ("length", "stop")


def test_chat_stream_seeded_sampling_is_exact(stack):
    target, tok, _, _, client = stack
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi there"}]
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0.8,
                                            top_p=0.9, seed=42, stream=True)
    pieces, finish = [], None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    want, _ = expected_text(target, tok, ids, 20, SamplingParams(0.8, 0.9, 0, 42))
    assert "".join(pieces) == want and finish in ("length", "stop")
    # the same request without streaming gives the same text
    r = client.chat.completions.create(model="tiny", messages=messages, max_tokens=20, temperature=0.8,
                                       top_p=0.9, seed=42)
    assert r.choices[0].message.content == want and r.choices[0].message.role == "assistant"


def test_stop_strings(stack):
    target, tok, _, _, client = stack
    prompt = "stop here:"
    full, _ = expected_text(target, tok, list(tok(prompt)["input_ids"]), 30)
    stop = full[5:7]
    assert stop
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=30, temperature=0, stop=[stop])
    assert r.choices[0].text == full[: full.index(stop)] and r.choices[0].finish_reason == "stop"
    pieces = [c.choices[0].text for c in client.completions.create(model="tiny", prompt=prompt, max_tokens=30,
                                                                   temperature=0, stop=stop, stream=True)]
    assert "".join(pieces) == full[: full.index(stop)]


def test_concurrent_requests_are_each_exact(stack):
    target, tok, cloud, _, client = stack
    prompts = [f"request number {i}:" for i in range(5)]

    def one(p):
        return client.completions.create(model="tiny", prompt=p, max_tokens=16, temperature=0).choices[0].text

    with ThreadPoolExecutor(5) as ex:
        outs = list(ex.map(one, prompts))
    for p, out in zip(prompts, outs, strict=True):
        assert out == expected_text(target, tok, list(tok(p)["input_ids"]), 16)[0]
    time.sleep(0.2)
    assert len(cloud.server.sessions) == 0  # every request said Bye


def test_abandoned_stream_frees_its_cloud_session(stack):
    import httpx

    _, _, cloud, daemon, _ = stack
    body = {"model": "tiny", "prompt": "a long one", "max_tokens": 600, "temperature": 0, "stream": True}
    with httpx.Client(timeout=30) as http, http.stream("POST", f"{daemon.base}/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break
        assert len(cloud.server.sessions) == 1
    t0 = time.time()
    while len(cloud.server.sessions) and time.time() - t0 < 10:
        time.sleep(0.05)
    assert len(cloud.server.sessions) == 0


def test_bad_requests_get_openai_errors(stack):
    _, _, _, _, client = stack
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="", max_tokens=4)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model="tiny", prompt="x", max_tokens=4, n=2)


def test_cloud_down_gives_502(tiny_dir):
    folder = tiny_dir("target", seed=0, dtype="float64")
    service = EdgeService([open_edge_model(folder, "torch", 256)], "ws://127.0.0.1:9", model_name="tiny")
    daemon = Daemon(service)
    try:
        client = openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as e:
            client.completions.create(model="tiny", prompt="x", max_tokens=4, temperature=0)
        assert e.value.status_code == 502
    finally:
        daemon.close()


def test_prompt_longer_than_the_clouds_context_gives_400(tiny_pair, tiny_dir):
    """The client's error, as an over-long max_tokens is: 400 context_length_exceeded, not 502."""
    target, _ = tiny_pair
    folder = tiny_dir("target", seed=0, dtype="float64")
    cloud = BackgroundServer(VerifierServer(target, Limits(max_context=64)))
    service = EdgeService([open_edge_model(folder, "torch", 1024)], cloud.url, tree=TreeParams(3, 8, 2, 2),
                          model_name="tiny")
    daemon = Daemon(service)
    try:
        client = openai.OpenAI(base_url=f"{daemon.base}/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="tiny", prompt="a prompt of far more than sixty-four bytes " * 3,
                                      max_tokens=4, temperature=0)
        assert e.value.status_code == 400 and e.value.code == "context_length_exceeded"
    finally:
        daemon.close()
        cloud.close()


def test_rapid_edge_process_serves_and_stops_on_sigterm(stack, tiny_dir, tmp_path):
    target, tok, cloud, _, _ = stack
    folder = tiny_dir("target", seed=0, dtype="float64")
    (tmp_path / "token").write_text(TOKEN + "\n")
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("RAPID_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "rapid.cli", "edge", "--draft", folder, "--backend", "torch",
                             "--cloud", cloud.url, "--token-file", str(tmp_path / "token"), "--listen",
                             f"127.0.0.1:{port}", "--parallel", "1", "--capacity", "512",
                             "--temperature", "0", "--max-tokens", "3"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x", max_retries=0, timeout=30)
        t0 = time.time()
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                assert proc.poll() is None and time.time() - t0 < 60, proc.stdout.read().decode()[-2000:]
                time.sleep(0.2)
        r = client.completions.create(model="target", prompt="hello", max_tokens=8, temperature=0)
        assert r.choices[0].text == expected_text(target, tok, list(tok("hello")["input_ids"]), 8)[0]
        r = client.completions.create(model="target", prompt="hello")  # the daemon's flags: greedy, 3 tokens
        assert r.usage.completion_tokens == 3
        assert r.choices[0].text == expected_text(target, tok, list(tok("hello")["input_ids"]), 3)[0]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()




def test_openai_stream_while_three_other_edges_share_the_cloud(stack, tiny_pair):
    """The issue's picture: an OpenAI client streams from `rapid edge` while three other edges
    (their own drafters and cloud sessions) verify on the same `rapid serve`; all exact."""
    import asyncio

    from rapid.engines.torch_engine import TorchEngine
    from rapid.runtime.coordinator import Coordinator, CoordinatorConfig
    from rapid.runtime.drafter import Drafter
    from rapid.runtime.link import CloudLink
    from rapid.runtime.policies import POLICIES

    target, tok, cloud, _, client = stack
    _, drafts = tiny_pair
    others = {name: list(f"edge {name} says".encode()) for name in ("fixed", "ipdg", "rapid")}

    def other_edge(name):
        drafter = Drafter(TorchEngine(drafts["partial"], capacity=512), TreeParams(3, 8, 2, 2), (256,))
        coord = Coordinator(drafter, CloudLink(cloud.url, token=TOKEN), POLICIES[name], CoordinatorConfig(depth=3))
        return asyncio.run(coord.generate(others[name], 40, SamplingParams())).tokens

    with ThreadPoolExecutor(3) as ex:
        futures = {name: ex.submit(other_edge, name) for name in others}
        prompt = "streaming while others verify:"
        stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0, stream=True)
        text = "".join(chunk.choices[0].text for chunk in stream)
        results = {name: f.result(timeout=120) for name, f in futures.items()}
    assert text == expected_text(target, tok, list(tok(prompt)["input_ids"]), 24)[0]
    for name, tokens in results.items():
        assert tokens == reference_decode(target, others[name], 40, SamplingParams(), (256,)), name
