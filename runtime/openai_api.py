"""The OpenAI-compatible HTTP API of ``rapid edge``: :func:`create_app` (FastAPI).

Owns the endpoints — ``POST /v1/completions``, ``POST /v1/chat/completions`` (JSON or
server-sent events), ``GET /v1/models``, ``GET /health``, ``GET /metrics`` — request
validation (``n``, ``temperature``, ``top_p``, ``max_tokens``, ``stop``, ``seed``), the
OpenAI-shaped responses and error bodies, and noticing clients that hang up. Generation itself
is :class:`rapid.runtime.engine_pool.EdgeService`.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
import uuid
from typing import Any

from rapid.runtime.engine_pool import EdgeService, Request

try:  # FastAPI resolves endpoint annotations from module globals (this module uses string annotations)
    from fastapi import Request as HTTPRequest
except ImportError:  # the edge extra is not installed: main() reports it
    HTTPRequest = Any  # type: ignore[misc,assignment]


def create_app(service: EdgeService):
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from prometheus_client import generate_latest

    app = FastAPI(title="RAPID edge", version="1")

    def error(status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status)

    @app.get("/health")
    async def health():
        return {"status": "ok", "cloud": service.cloud, "engines": len(service.edges)}

    @app.get("/metrics")
    async def metrics():
        return PlainTextResponse(generate_latest(service.metrics.registry).decode(),
                                 media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": service.model_name, "object": "model", "created": 0,
                                            "owned_by": "rapid"}]}

    def parse(body: dict) -> Request:
        n = body.get("n", 1)
        if n not in (None, 1):
            raise ValueError("only n = 1 is supported")
        temperature = body.get("temperature")
        temperature = 1.0 if temperature is None else float(temperature)
        top_p = body.get("top_p")
        top_p = 1.0 if top_p is None else float(top_p)
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or 16
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else list(stop)
        if not all(isinstance(s, str) for s in stop) or len(stop) > 4:
            raise ValueError("stop must be a string or up to 4 strings")
        seed = body.get("seed")
        if seed is None:
            seed = secrets.randbits(31) if temperature > 0 else 0
        if not 0 <= temperature <= 2 or not 0 < top_p <= 1 or int(max_tokens) < 1:
            raise ValueError("temperature in [0, 2], top_p in (0, 1], max_tokens >= 1")
        return Request([], int(max_tokens), temperature, top_p, int(seed) & 0x7FFFFFFF, stop)

    async def run(http: HTTPRequest, body: dict, chat: bool):
        endpoint = "chat" if chat else "completions"
        try:
            req = parse(body)
            if chat:
                messages = body.get("messages")
                if not isinstance(messages, list) or not messages:
                    raise ValueError("messages must be a non-empty list")
                req.prompt_ids = service.encode_chat(messages)
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, list) and len(prompt) == 1:
                    prompt = prompt[0]
                if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
                    req.prompt_ids = list(prompt)
                elif isinstance(prompt, str) and prompt:
                    req.prompt_ids = service.encode_text(prompt)
                else:
                    raise ValueError("prompt must be one non-empty string or a list of token ids")
        except (ValueError, TypeError) as e:
            service.metrics.requests.labels(endpoint, "400").inc()
            return error(400, str(e))
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        res, abort, task = service.start(req)
        obj = "chat.completion" if chat else "text_completion"

        def choice(text: str | None, finish: str | None, first: bool = False) -> dict:
            if chat:
                delta: dict[str, Any] = {}
                if first:
                    delta["role"] = "assistant"
                if text is not None:
                    delta["content"] = text
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}

        def usage() -> dict:
            return {"prompt_tokens": len(req.prompt_ids), "completion_tokens": res.completion_tokens,
                    "total_tokens": len(req.prompt_ids) + res.completion_tokens}

        if body.get("stream"):
            async def events():
                chunk_obj = "chat.completion.chunk" if chat else "text_completion"
                head = {"id": rid, "object": chunk_obj, "created": created, "model": service.model_name}
                try:
                    if chat:
                        yield f"data: {json.dumps({**head, 'choices': [choice(None, None, True)]})}\n\n"
                    while True:
                        piece = await res.pieces.get()
                        if piece is None:
                            break
                        yield f"data: {json.dumps({**head, 'choices': [choice(piece, None)]})}\n\n"
                    if res.error:
                        err = {"message": res.error, "type": res.error_type, "code": res.error_code}
                        yield f"data: {json.dumps({'error': err})}\n\n"
                    else:
                        last = {**head, "choices": [choice(None if chat else "", res.finish_reason)]}
                        if (body.get("stream_options") or {}).get("include_usage"):
                            last["usage"] = usage()
                        yield f"data: {json.dumps(last)}\n\n"
                    yield "data: [DONE]\n\n"
                    service.metrics.requests.labels(endpoint, "200").inc()
                finally:
                    abort.set()  # client gone (or done): stop at the next round, free the cloud session

            return StreamingResponse(events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

        waiter = asyncio.ensure_future(task)
        while not waiter.done():  # notice a client that hangs up while we generate
            await asyncio.wait({waiter}, timeout=0.25)
            if not waiter.done() and await http.is_disconnected():
                abort.set()
        if res.error:
            service.metrics.requests.labels(endpoint, str(res.status)).inc()
            return error(res.status, res.error, res.error_type, res.error_code)
        service.metrics.requests.labels(endpoint, "200").inc()
        if chat:
            ch = {"index": 0, "message": {"role": "assistant", "content": res.text}, "logprobs": None,
                  "finish_reason": res.finish_reason}
        else:
            ch = choice(res.text, res.finish_reason)
        return {"id": rid, "object": obj, "created": created, "model": service.model_name, "choices": [ch],
                "usage": usage()}

    async def from_json(http: HTTPRequest, chat: bool):
        try:
            body = await http.json()
        except Exception:  # noqa: BLE001
            return error(400, "the body must be JSON")
        return await run(http, body if isinstance(body, dict) else {}, chat)

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest):
        return await from_json(http, False)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: HTTPRequest):
        return await from_json(http, True)

    return app
