"""The OpenAPI description of ``rapid edge``'s API (``GET /openapi.json``), complete enough to fuzz.

The completion endpoints read their JSON body themselves (``rapid.runtime.openai_schema`` gives
OpenAI-shaped errors, which FastAPI's own validation would not), so FastAPI cannot see the body
or the statuses. This module describes them:

    request body   the pydantic models CompletionBody / ChatBody, as JSON Schema
    200            application/json (the completion object) or text/event-stream (``stream: true``)
    400 401 404    the OpenAI error body: bad or refused request (a context overflow:
                   ``context_length_exceeded``), a missing API key, an unknown model
    502 503 504    the same body: the cloud failed, is full, or missed its deadline

A schema fuzzer (schemathesis: ``tests/runtime/test_api_fuzz.py``) sends what these schemas allow
and what they forbid, and checks each answer against its documented status and body.
"""

from __future__ import annotations

from typing import Any

from rapid.runtime.openai_schema import ChatBody, CompletionBody

REF = "#/components/schemas/{model}"

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error"], "additionalProperties": False,
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "param", "code"], "additionalProperties": False,
        "properties": {"message": {"type": "string", "minLength": 1}, "type": {"type": "string", "minLength": 1},
                       "param": {"type": ["string", "null"]}, "code": {"type": ["string", "null"]}}}},
}

_CHOICES = {"type": "array", "minItems": 1, "items": {"type": "object", "required": ["index", "finish_reason"]}}
_EVENT = {"type": "object", "required": ["data"],  # one server-sent event: a chunk, an error, or [DONE]
          "properties": {"data": {"type": "string", "minLength": 1}}}
_USAGE = {"type": "object", "required": ["prompt_tokens", "completion_tokens", "total_tokens"]}


def _completion_schema(kind: str) -> dict[str, Any]:
    return {"type": "object", "required": ["id", "object", "created", "model", "choices", "usage"],
            "properties": {"id": {"type": "string"}, "object": {"const": kind}, "created": {"type": "integer"},
                           "model": {"type": "string"}, "choices": _CHOICES, "usage": _USAGE}}


ERRORS = {400: "bad or refused request (a context overflow: code context_length_exceeded)",
          401: "missing or wrong API key (--api-key)", 404: "unknown model",
          502: "the cloud verifier failed", 503: "the cloud verifier is full", 504: "the cloud missed its deadline"}


def _responses(kind: str) -> dict[int | str, dict[str, Any]]:
    out: dict[int | str, dict[str, Any]] = {
        200: {"description": f"a {kind} object, or with stream: true server-sent events ending in data: [DONE]",
              "content": {"application/json": {"schema": _completion_schema(kind)},
                          "text/event-stream": {"schema": _EVENT}}}}
    for status, why in ERRORS.items():
        out[status] = {"description": why, "content": {"application/json": {"schema": {"$ref": REF.format(model="Error")}}}}
    return out


def completion_route_doc(chat: bool) -> dict[str, Any]:
    """``app.post`` keyword arguments (``openapi_extra``, ``responses``) for one completion route."""
    model = ChatBody if chat else CompletionBody
    body = {"required": True, "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}}
    return {"openapi_extra": {"requestBody": body},
            "responses": _responses("chat.completion" if chat else "text_completion")}


def add_components(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` (FastAPI's OpenAPI document) with the body models and the error body in its components."""
    schemas = doc.setdefault("components", {}).setdefault("schemas", {})
    for model in (CompletionBody, ChatBody):
        schema = model.model_json_schema(ref_template=REF)
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
    schemas["Error"] = ERROR_SCHEMA
    for path in doc.get("paths", {}).values():  # FastAPI's own 422 never reaches a client: it answers 400
        for op in path.values():
            op.get("responses", {}).pop("422", None)
    return doc
