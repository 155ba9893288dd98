"""The OpenAI-compatible HTTP API of ``rapid edge``: :func:`create_app` (FastAPI).

Owns the endpoints — ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON or
server-sent events), ``GET /v1/models``, ``GET /health`` (readiness: 503 while the cloud does not
answer), ``GET /livez`` (liveness), ``GET /metrics`` — the OpenAI-shaped responses, and noticing
clients that hang up. Request validation is :mod:`.openai_schema`; generation is
:class:`rapid.runtime.engine_pool.EdgeService`.

Every error has the OpenAI shape ``{"error": {"message", "type", "param", "code"}}``: 400 for a
bad or refused request (a context overflow: ``context_length_exceeded``), 404 for an unknown
route or model (``model_not_found``), 405, 502/503/504 for the cloud, 500 only for a bug — with
no traceback in the body. A stream that fails before its first token gets that status too;
``rapid_edge_requests_total`` counts the status that was sent.

With an API key (``rapid edge --api-key`` / ``$RAPID_API_KEY``) every ``/v1/*`` route needs
``Authorization: Bearer <key>`` (compared in constant time, ``rapid.core.auth``), else 401
``invalid_api_key``; ``/health``, ``/livez`` and ``/metrics`` stay open, as in vLLM.
Log-probabilities are laid out by :mod:`.openai_logprobs`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import Any

from rapid.core.auth import check_authorization_headers
from rapid.runtime.engine_pool import EdgeService, Request, Result
from rapid.runtime.openai_logprobs import (
    TokenLogprob,
    TokenNames,
    chat_logprobs,
    completion_logprobs,
)
from rapid.runtime.openai_schema import (
    ApiError,
    ChatBody,
    RequestDefaults,
    logprobs_of,
    max_tokens_of,
    parse_body,
    sampling_of,
    stop_strings,
)
from rapid.runtime.openapi_doc import add_components, completion_route_doc
from rapid.runtime.text_stream import Piece

log = logging.getLogger("rapid.edge.api")

try:  # FastAPI resolves endpoint annotations from module globals (this module uses string annotations)
    from fastapi import Request as HTTPRequest
except ImportError:  # the edge extra is not installed: main() reports it
    HTTPRequest = Any  # type: ignore[misc,assignment]


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def build_request(service: EdgeService, body, defaults: RequestDefaults) -> Request:
    """A validated body → the generation request (prompt tokens, limits, sampling, stops)."""
    temperature, top_p, top_k, seed = sampling_of(body, defaults)
    req = Request([], max_tokens_of(body, defaults), temperature, top_p, seed, stop_strings(body), top_k,
                  logprobs_of(body))
    if isinstance(body, ChatBody):
        req.prompt_ids = service.encode_chat([{"role": m.role, "content": m.text()} for m in body.messages])
    else:
        prompt = body.prompt
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            vocab = len(service.tokenizer)
            if any(not 0 <= t < vocab for t in prompt):
                raise ApiError(400, f"prompt token ids must be in [0, {vocab})", "prompt")
            req.prompt_ids = list(prompt)
        elif isinstance(prompt, str) and prompt:
            req.prompt_ids = service.encode_text(prompt)
        else:
            raise ApiError(400, "prompt must be one non-empty string or a non-empty list of token ids", "prompt")
    return req


def create_app(service: EdgeService, defaults: RequestDefaults | None = None, api_key: str | None = None):
    """The FastAPI app: /v1/completions, /v1/chat/completions, /v1/models, probes and /metrics;
    every error has the OpenAI error body."""
    from fastapi import FastAPI

    app = FastAPI(title="RAPID edge", version="1")
    _add_error_handling(app, service, api_key)
    _add_probes(app, service)
    run = _completion_endpoint(service, defaults or RequestDefaults())

    @app.post("/v1/completions", **completion_route_doc(chat=False))
    async def completions(http: HTTPRequest):
        return await run(http, False)

    @app.post("/v1/chat/completions", **completion_route_doc(chat=True))
    async def chat_completions(http: HTTPRequest):
        return await run(http, True)

    plain_openapi = app.openapi
    app.openapi = lambda: app.openapi_schema or add_components(plain_openapi())  # the bodies and errors
    return app


def _error(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
           code: str | None = None):
    from fastapi.responses import JSONResponse

    return JSONResponse(error_body(message, kind, param, code), status)


def _add_error_handling(app, service: EdgeService, api_key: str | None) -> None:
    """The API key check, and OpenAI error bodies for HTTP, validation and unexpected errors."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.middleware("http")
    async def require_api_key(http: HTTPRequest, call_next):
        if api_key is not None and http.url.path.startswith("/v1/") and \
                not check_authorization_headers(http.headers.getlist("authorization"), api_key):
            service.metrics.requests.labels("auth", "401").inc()
            return _error(401, "Incorrect or missing API key: send Authorization: Bearer <key>", code="invalid_api_key")
        return await call_next(http)

    @app.exception_handler(HTTPException)
    async def http_error(_, exc: HTTPException):
        kind = {404: "not_found_error", 405: "invalid_request_error"}.get(exc.status_code, "invalid_request_error")
        return _error(exc.status_code, str(exc.detail), kind)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_, exc: RequestValidationError):
        return _error(400, str(exc.errors()[0].get("msg", "invalid request")) if exc.errors() else "invalid request")

    @app.exception_handler(Exception)
    async def internal_error(_, exc: Exception):
        log.exception("unexpected error in the API")
        return _error(500, f"internal error ({type(exc).__name__}); see the daemon's log", "internal_error")


def _add_probes(app, service: EdgeService) -> None:
    """/livez, /health (is the cloud reachable), /metrics (Prometheus) and /v1/models."""
    from fastapi.responses import JSONResponse, PlainTextResponse
    from prometheus_client import generate_latest

    @app.get("/livez")
    async def livez():
        return {"status": "alive"}

    @app.get("/health", responses={503: {"description": "the cloud verifier does not answer (body: status, reason)"}})
    async def health():
        why = await service.cloud_problem()
        body = {"status": "ok" if why is None else "unavailable", "cloud": service.cloud, "engines": len(service.edges)}
        if why is not None:
            body["reason"] = why
        return JSONResponse(body, 200 if why is None else 503)

    @app.get("/metrics", response_class=PlainTextResponse)  # documented as text, as it answers
    async def metrics():
        return PlainTextResponse(generate_latest(service.metrics.registry).decode(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": service.model_name, "object": "model", "created": 0,
                                            "owned_by": "rapid"}]}


def _completion_endpoint(service: EdgeService, defaults: RequestDefaults):
    """``run(http, chat)``: parse, start the generation, then stream or answer whole; a client that
    hangs up mid-generation abandons it at the next round."""

    async def run(http: HTTPRequest, chat: bool):
        endpoint = "chat" if chat else "completions"
        try:
            try:
                raw = await http.json()
            except ValueError:
                raise ApiError(400, "the body must be JSON") from None
            body = parse_body(raw, chat, service.model_name)
            req = build_request(service, body, defaults)
        except ApiError as e:
            service.metrics.requests.labels(endpoint, str(e.status)).inc()
            return _error(e.status, e.message, e.kind, e.param, e.code)
        res, abort, task = service.start(req)
        reply = Reply(service, req, res, chat, body.stream_options is not None and body.stream_options.include_usage)
        if body.stream:
            first = await res.pieces.get()  # the status is known once the first token (or error) is
            if first is None and res.error:
                return reply.failed(endpoint)
            return reply.stream(endpoint, first, abort)
        waiter = asyncio.ensure_future(task)
        while not waiter.done():  # notice a client that hangs up while we generate
            await asyncio.wait({waiter}, timeout=0.25)
            if not waiter.done() and await http.is_disconnected():
                abort.set()
        if res.error:
            return reply.failed(endpoint)
        service.metrics.requests.labels(endpoint, "200").inc()
        return reply.whole()

    return run


class Reply:
    """The OpenAI response objects of one request: whole, streamed, or an error."""

    def __init__(self, service: EdgeService, req: Request, res: Result, chat: bool, include_usage: bool) -> None:
        self.service, self.req, self.res, self.chat, self.include_usage = service, req, res, chat, include_usage
        self.names = TokenNames(service.tokenizer) if req.logprobs >= 0 else None
        self.rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def _head(self, obj: str) -> dict:
        return {"id": self.rid, "object": obj, "created": self.created, "model": self.service.model_name}

    def usage(self) -> dict:
        n = len(self.req.prompt_ids)
        return {"prompt_tokens": n, "completion_tokens": self.res.completion_tokens,
                "total_tokens": n + self.res.completion_tokens}

    def logprobs(self, records: list[TokenLogprob] | None) -> dict | None:
        """The choice's ``logprobs`` (None when not asked for, or for a chunk without tokens)."""
        if self.names is None or records is None:
            return None
        return (chat_logprobs if self.chat else completion_logprobs)(records, self.names)

    def choice(self, text: str | None, finish: str | None, first: bool = False,
               records: list[TokenLogprob] | None = None) -> dict:
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "logprobs": self.logprobs(records), "finish_reason": finish}
        return {"index": 0, "text": text or "", "logprobs": self.logprobs(records), "finish_reason": finish}

    def failed(self, endpoint: str):
        r = self.res
        self.service.metrics.requests.labels(endpoint, str(r.status)).inc()
        return _error(r.status, r.error or "generation failed", r.error_type, None, r.error_code)

    def whole(self) -> dict:
        r = self.res
        if self.chat:
            ch = {"index": 0, "message": {"role": "assistant", "content": r.text}, "logprobs": self.logprobs(r.logprobs),
                  "finish_reason": r.finish_reason}
        else:
            ch = self.choice(r.text, r.finish_reason, records=r.logprobs)
        obj = "chat.completion" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [ch], "usage": self.usage()}

    def stream(self, endpoint: str, first: Piece | None, abort: asyncio.Event):
        from fastapi.responses import StreamingResponse

        head = self._head("chat.completion.chunk" if self.chat else "text_completion")
        res, metrics = self.res, self.service.metrics

        def event(obj: dict) -> str:
            return f"data: {json.dumps(obj)}\n\n"

        async def events():
            try:
                if self.chat:
                    yield event({**head, "choices": [self.choice(None, None, True)]})
                piece = first
                while piece is not None:
                    yield event({**head, "choices": [self.choice(piece.text, None, records=piece.logprobs)]})
                    piece = await res.pieces.get()
                if res.error:  # after the first token the status is sent: an error event says it
                    yield event(error_body(res.error, res.error_type, None, res.error_code))
                else:
                    yield event({**head, "choices": [self.choice(None if self.chat else "", res.finish_reason)]})
                    if self.include_usage:
                        yield event({**head, "choices": [], "usage": self.usage()})
                yield "data: [DONE]\n\n"
                metrics.requests.labels(endpoint, "200" if not res.error else "200-stream-error").inc()
            finally:
                abort.set()  # client gone (or done): stop at the next round, free the cloud session

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
