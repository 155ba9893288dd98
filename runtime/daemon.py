"""``rapid edge``: the long-lived edge runtime with an OpenAI-compatible local HTTP API.

    rapid edge --draft MODEL | --engine EXPORT_DIR --cloud wss://HOST:PORT --token-file F \\
               [--listen 127.0.0.1:8000] [--policy rapid] [--parallel 2]

Endpoints (FastAPI + uvicorn): ``POST /v1/completions``, ``POST /v1/chat/completions`` (chat
template from the tokenizer; ``stream: true`` → server-sent events ending in ``data: [DONE]``;
``max_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``), ``GET /v1/models``, ``GET /health``,
``GET /metrics`` (Prometheus text). Clean shutdown on SIGTERM/SIGINT (uvicorn's handlers: stop
accepting, finish in-flight requests up to ``--shutdown-timeout``).

Concurrency: a draft engine holds one sequence's KV, so it serves one request at a time. The
daemon opens ``--parallel`` engines (each its own weights + KV) and hands them out first come,
first served; further requests wait in FIFO order (fair). Each request has its own cloud session
(its own ``CloudLink``, with reconnect/resume). A request whose client goes away is abandoned at
the next round boundary: its link says ``Bye`` (the cloud frees the session's KV at once) and its
engine goes back to the pool.

Exactness: the tokens equal target-only decoding; with ``temperature > 0`` and no ``seed`` the
daemon draws a random seed per request (OpenAI semantics: not reproducible unless seeded).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import secrets
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from rapid.errors import RapidError

try:  # FastAPI resolves endpoint annotations from module globals (this module uses string annotations)
    from fastapi import Request as HTTPRequest
except ImportError:  # the edge extra is not installed: main() reports it
    HTTPRequest = Any  # type: ignore[misc,assignment]

log = logging.getLogger("rapid.edge.daemon")


class _Abort(Exception):
    """Raised inside the coordinator's token callback to end a generation at a round boundary."""


@dataclass(slots=True)
class Request:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: list[str]


@dataclass(slots=True)
class Result:
    text: str = ""
    finish_reason: str = "length"
    completion_tokens: int = 0
    error: str | None = None
    pieces: asyncio.Queue = field(default_factory=asyncio.Queue)  # str pieces, then None


class EdgeMetrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        self.requests = Counter("rapid_edge_requests", "HTTP generation requests", ["endpoint", "status"], registry=r)
        self.active = Gauge("rapid_edge_active_requests", "Generations running", registry=r)
        self.waiting = Gauge("rapid_edge_waiting_requests", "Requests waiting for a draft engine", registry=r)
        self.tokens = Counter("rapid_edge_generated_tokens", "Tokens returned", registry=r)
        self.rounds = Counter("rapid_spec_decode_num_rounds", "Speculation rounds", registry=r)
        self.draft_tokens = Counter("rapid_spec_decode_num_draft_tokens", "Tree nodes sent", registry=r)
        self.accepted = Counter("rapid_spec_decode_num_accepted_tokens", "Draft tokens accepted", registry=r)
        self.depth = Histogram("rapid_edge_tree_depth", "Planned tree depth per round", buckets=(1, 2, 3, 4, 5, 6, 8, 10, 12, 16), registry=r)
        self.esr = Gauge("rapid_edge_esr", "Expected speedup ratio of the last round (CAAC)", registry=r)
        self.eta = Gauge("rapid_edge_eta", "Congestion ratio eta of the last round (CAAC)", registry=r)
        self.interrupts = Counter("rapid_edge_interrupts", "Proactive branches stopped by feedback", registry=r)
        self.hits = Counter("rapid_edge_proactive_hits", "Proactive branches kept", registry=r)
        self.misses = Counter("rapid_edge_proactive_misses", "Proactive branches discarded", registry=r)
        self.step = Histogram("rapid_edge_draft_step_seconds", "Draft step latency",
                              buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5), registry=r)
        self.cloud_rtt = Histogram("rapid_edge_cloud_seconds", "Tree sent → verdict received",
                                   buckets=(0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5), registry=r)
        self.reconnects = Counter("rapid_edge_reconnects", "Cloud link reconnects", registry=r)

    def observe(self, records, link_stats: dict) -> None:
        for rec in records:
            self.rounds.inc()
            self.draft_tokens.inc(rec.tree_nodes)
            self.accepted.inc(rec.accepted)
            self.depth.observe(rec.depth)
            self.esr.set(rec.esr)
            self.eta.set(rec.eta)
            self.cloud_rtt.observe(rec.cloud_s)
            if rec.interrupted_at is not None:
                self.interrupts.inc()
            if rec.proactive_hit is True:
                self.hits.inc()
            elif rec.proactive_hit is False:
                self.misses.inc()
            if rec.draft_steps:
                self.step.observe(rec.draft_s / rec.draft_steps)
        self.reconnects.inc(link_stats.get("reconnects", 0))


class EdgeService:
    """The engine pool, one cloud session per request, stop strings, streaming pieces."""

    def __init__(self, edges: list, cloud: str, *, policy: str = "rapid", tree=None, token: str | None = None,
                 ssl=None, model_name: str = "rapid", link_options: dict | None = None) -> None:
        from rapid.runtime.policies import get_policy
        from rapid.runtime.tree import TreeParams

        self.edges = edges
        self.tokenizer = edges[0].tokenizer
        self.cloud, self.token, self.ssl = cloud, token, ssl
        self.policy = get_policy(policy)
        self.tree = tree or TreeParams()
        self.model_name = model_name
        self.link_options = link_options or {}
        self.metrics = EdgeMetrics()
        self._pool: asyncio.Queue | None = None

    def pool(self) -> asyncio.Queue:
        if self._pool is None:
            self._pool = asyncio.Queue()
            for e in self.edges:
                self._pool.put_nowait(e)
        return self._pool

    def encode_chat(self, messages: list[dict]) -> list[int]:
        msgs = []
        for m in messages:
            content = m.get("content") or ""
            if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            msgs.append({"role": m.get("role", "user"), "content": content})
        ids = self.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)

    def encode_text(self, prompt: str) -> list[int]:
        return list(self.tokenizer(prompt)["input_ids"])

    def start(self, req: Request) -> tuple[Result, asyncio.Event, asyncio.Task]:
        res, abort = Result(), asyncio.Event()
        task = asyncio.get_running_loop().create_task(self._generate(req, res, abort))
        return res, abort, task

    async def _generate(self, req: Request, res: Result, abort: asyncio.Event) -> None:
        from rapid.runtime.coordinator import Coordinator, CoordinatorConfig
        from rapid.runtime.detok import Detokenizer
        from rapid.runtime.drafter import Drafter
        from rapid.runtime.link import CloudLink
        from rapid.sampling import SamplingParams

        pool = self.pool()
        self.metrics.waiting.inc()
        try:
            edge = await pool.get()
        finally:
            self.metrics.waiting.dec()
        self.metrics.active.inc()
        link = CloudLink(self.cloud, token=self.token, ssl=self.ssl, **self.link_options)
        detok = Detokenizer(self.tokenizer)
        full, sent = "", 0
        hold = max((len(s) for s in req.stop), default=1) - 1

        def emit(upto: int) -> None:
            nonlocal sent
            if upto > sent:
                res.pieces.put_nowait(full[sent:upto])
                sent = upto

        def check(final: bool) -> bool:
            """Emit what is safe; True when a stop string was found."""
            nonlocal full
            hits = [i for i in (full.find(s, max(0, sent - len(s))) for s in req.stop if s) if i >= 0]
            if hits:
                full = full[:min(hits)]
                emit(len(full))
                return True
            emit(len(full) if final else max(sent, len(full) - hold))
            return False

        def on_tokens(ids: list[int]) -> None:
            nonlocal full
            res.completion_tokens += len(ids)
            full += detok.push(ids)
            if check(False):
                res.finish_reason = "stop"
                raise _Abort
            if abort.is_set():
                res.finish_reason = "abandoned"
                raise _Abort

        try:
            drafter = Drafter(edge.engine, self.tree, edge.stop_ids)
            coord = Coordinator(drafter, link, self.policy, CoordinatorConfig(depth=self.tree.depth))
            sampling = SamplingParams(req.temperature, req.top_p, 0, req.seed)
            try:
                gen = await coord.generate(req.prompt_ids, req.max_tokens, sampling, on_tokens)
            except _Abort:
                pass
            else:
                full += detok.flush()
                res.finish_reason = "stop" if gen.stopped else "length"
                if check(True):
                    res.finish_reason = "stop"
                self.metrics.observe(gen.records, link.stats)
        except RapidError as e:
            res.error = str(e)
            log.warning("generation failed: %s", e)
        except Exception as e:  # noqa: BLE001 — reported to the client, the daemon stays up
            log.exception("generation failed")
            res.error = f"{type(e).__name__}: {e}"
        finally:
            try:
                await link.close()  # Bye: the cloud frees the session's KV now
            finally:
                pool.put_nowait(edge)
                self.metrics.active.dec()
                res.text = full[:sent] if res.finish_reason in ("stop", "abandoned") else full
                self.metrics.tokens.inc(res.completion_tokens)
                res.pieces.put_nowait(None)


def create_app(service: EdgeService):
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from prometheus_client import generate_latest

    app = FastAPI(title="RAPID edge", version="1")

    def error(status: int, message: str, kind: str = "invalid_request_error"):
        return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": None}}, status)

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
                        yield f"data: {json.dumps({'error': {'message': res.error, 'type': 'cloud_error'}})}\n\n"
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
            service.metrics.requests.labels(endpoint, "502").inc()
            return error(502, res.error, "cloud_error")
        service.metrics.requests.labels(endpoint, "200").inc()
        if chat:
            ch = {"index": 0, "message": {"role": "assistant", "content": res.text}, "logprobs": None,
                  "finish_reason": res.finish_reason}
        else:
            ch = choice(res.text, res.finish_reason)
        return {"id": rid, "object": obj, "created": created, "model": service.model_name, "choices": [ch],
                "usage": usage()}

    @app.post("/v1/completions")
    async def completions(http: HTTPRequest):
        try:
            body = await http.json()
        except Exception:  # noqa: BLE001
            return error(400, "the body must be JSON")
        return await run(http, body if isinstance(body, dict) else {}, False)

    @app.post("/v1/chat/completions")
    async def chat_completions(http: HTTPRequest):
        try:
            body = await http.json()
        except Exception:  # noqa: BLE001
            return error(400, "the body must be JSON")
        return await run(http, body if isinstance(body, dict) else {}, True)

    return app


def _server_class():
    import contextlib

    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGTERM after its graceful shutdown (exit status -15); a service
        that shut down cleanly should exit 0, so handle the signals here and return."""

        @contextlib.contextmanager
        def capture_signals(self):
            import signal

            previous = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for s, h in previous.items():
                    signal.signal(s, h)

    return Server


def build_parser() -> argparse.ArgumentParser:
    from rapid.cli import _add_tree_args

    ap = argparse.ArgumentParser(prog="rapid edge", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--engine", help="an export folder (rapid export): ONNX / TensorRT draft")
    src.add_argument("--draft", help="HF id, local folder, .gguf or default-draft (PyTorch backend unless --backend)")
    ap.add_argument("--backend", default="auto", help="torch|onnx|trt|auto")
    ap.add_argument("--cloud", default="ws://127.0.0.1:8765", help="ws:// or wss:// URL of rapid serve")
    ap.add_argument("--token-file", help="shared secret for the cloud (else $RAPID_TOKEN)")
    ap.add_argument("--cafile", help="CA / self-signed certificate to trust for wss://")
    ap.add_argument("--listen", default="127.0.0.1:8000", help="HOST:PORT of the local OpenAI-compatible API")
    ap.add_argument("--parallel", type=int, default=2, help="draft engines = requests generated at once")
    ap.add_argument("--capacity", type=int, default=2048, help="draft KV capacity per engine")
    ap.add_argument("--model-name", help="model id reported by /v1/models (default: the draft's name)")
    ap.add_argument("--retry-timeout", type=float, default=30.0, help="silence before the link re-sends/reconnects")
    ap.add_argument("--shutdown-timeout", type=float, default=10.0, help="seconds to finish requests on SIGTERM")
    _add_tree_args(ap)
    return ap


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    from rapid.auth import client_ssl_context, load_token

    _Server = _server_class()
    from rapid.runtime.generate import open_edge_model
    from rapid.runtime.tree import TreeParams

    args = build_parser().parse_args(argv)
    source = args.engine or args.draft or "default-draft"
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        raise RapidError(f"--listen wants HOST:PORT, got {args.listen!r}")
    token = load_token(args.token_file)
    if token is None:
        log.warning("no --token-file / RAPID_TOKEN: connecting to the cloud without a token")
    ssl = client_ssl_context(args.cloud, args.cafile)
    edges = [open_edge_model(source, args.backend, args.capacity, args.threads) for _ in range(max(1, args.parallel))]
    service = EdgeService(edges, args.cloud, policy=args.policy, tree=TreeParams(args.depth, args.budget, args.topk, args.width),
                          token=token, ssl=ssl, model_name=args.model_name or os.path.basename(source.rstrip("/")),
                          link_options={"retry_timeout": args.retry_timeout})
    config = uvicorn.Config(create_app(service), host=host, port=int(port), log_level="info",
                            timeout_graceful_shutdown=args.shutdown_timeout, access_log=False)
    server = _Server(config)
    log.info("rapid edge: %s engine(s) of %s, cloud %s, API on http://%s:%s/v1", len(edges), source, args.cloud, host, port)
    server.run()  # returns after SIGTERM / SIGINT once in-flight requests finish
    log.info("rapid edge stopped")
    return 0
