"""``rapid edge``'s OpenAI API fuzzed from its own ``/openapi.json`` (schemathesis), on loopback.

A real verifier, the daemon's app under uvicorn, tiny models. Every operation gets schema-valid
and schema-invalid requests; each answer must be a documented status with its documented body
(the OpenAI error body for every 4xx), never a 5xx, and schema-invalid data must be refused.
Afterwards the daemon is still healthy and still exact. ``RAPID_FUZZ_EXAMPLES`` sets the cases per
operation (CI: the default; the longer run in docs/reliability.md: 1000).
"""

from __future__ import annotations

import os
from collections import Counter

import httpx
import pytest
import schemathesis
from edge_stack import TOKEN, Daemon, expected_text  # noqa: E402  (beside this file)
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from rapid.runtime.engine_pool import EdgeService
from rapid.runtime.generate import open_edge_model
from rapid.runtime.openai_schema import RequestDefaults
from rapid.runtime.tree import TreeParams
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer

EXAMPLES = int(os.environ.get("RAPID_FUZZ_EXAMPLES", "40"))
API_KEY = "fuzz-key"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          negative_data_rejection]
SEEN: Counter = Counter()  # (operation, status) → answers


@pytest.fixture(scope="module")
def fuzz_stack(tiny_pair, tiny_dir):
    target, _ = tiny_pair
    cloud = BackgroundServer(VerifierServer(target, token=TOKEN))
    edges = [open_edge_model(tiny_dir("target", seed=0, dtype="float64"), "torch", 512) for _ in range(2)]
    service = EdgeService(edges, cloud.url, token=TOKEN, tree=TreeParams(3, 8, 2, 2), model_name="tiny")
    daemon = Daemon(service, RequestDefaults(max_tokens=4), API_KEY)  # short answers unless a case asks
    yield target, edges[0].tokenizer, daemon
    daemon.close()
    cloud.close()


@pytest.fixture(scope="module")
def api_schema(fuzz_stack):
    return schemathesis.openapi.from_url(f"{fuzz_stack[2].base}/openapi.json")


def _operations(schema) -> list:
    return [result.ok() for result in schema.get_all_operations()]


def _check(case) -> None:
    response = case.call(headers=AUTH, timeout=60)
    SEEN[(f"{case.operation.method.upper()} {case.operation.path}", response.status_code)] += 1
    case.validate_response(response, checks=CHECKS)
    if 400 <= response.status_code < 500 and case.operation.path.startswith("/v1/"):
        error = response.json()["error"]  # the documented schema says so too; say it plainly
        assert error["message"] and error["type"], response.text


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_every_answer_is_documented_and_never_a_server_error(api_schema, mode):
    ops = _operations(api_schema)
    paths = {op.path for op in ops}
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models", "/health"} <= paths
    for op in ops:
        if mode is GenerationMode.NEGATIVE and not op.body:
            continue  # nothing to break in a GET without parameters

        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                  derandomize=True, database=None)
        @given(case=op.as_strategy(generation_mode=mode))
        def fuzz(case):
            _check(case)

        fuzz()


def test_the_daemon_is_healthy_and_exact_after_the_fuzz(fuzz_stack):
    target, tok, daemon = fuzz_stack
    print("fuzz answers:", dict(sorted(SEEN.items())))
    assert sum(SEEN.values()) >= 4, "the fuzz did not run"
    assert not any(status >= 500 for _, status in SEEN)
    with httpx.Client(base_url=daemon.base, headers=AUTH, timeout=60) as http:
        assert http.get("/health").status_code == 200
        ids = list(tok("still exact")["input_ids"])
        r = http.post("/v1/completions", json={"prompt": ids, "max_tokens": 12, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == expected_text(target, tok, ids, 12)[0]
        assert http.post("/v1/completions", json={"prompt": "x"}, headers={"Authorization": "Bearer no"}).json()[
            "error"]["code"] == "invalid_api_key"
        for body, param in (({"prompt": "x", "top_k": 2**64}, "top_k"),  # once a 502 (msgpack overflow)
                            ({"prompt": [True, False]}, "prompt"),  # once read as token ids [1, 0]
                            ({"prompt": "x", "max_tokens": "5"}, "max_tokens")):  # once read as 5
            r = http.post("/v1/completions", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"].startswith(param), r.text
        doc = http.get("/openapi.json").json()
        assert "text/plain" in doc["paths"]["/metrics"]["get"]["responses"]["200"]["content"]
