"""The edge daemon's engine pool and per-request generation: :class:`EdgeService`.

A draft engine holds one sequence's KV, so it serves one request at a time: the service hands
its engines out first come, first served from an ``asyncio.Queue`` (later requests wait in FIFO
order), opens one cloud session (``CloudLink``) per request, detokenizes, applies stop strings
and streams text pieces (with the scores of their tokens when log-probabilities were asked for)
through :class:`Result`; tokens a stop string cuts off lose their scores too. A request whose client went away is abandoned
at the next round boundary (:class:`_Abort`). The HTTP layer is :mod:`.openai_api`.
"""

from __future__ import annotations

import asyncio
import logging
import ssl as ssl_mod
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

from rapid.core.errors import ContextFullError, RapidError
from rapid.core.sampling import SamplingParams
from rapid.runtime.budget import default_max_tokens
from rapid.runtime.edge_config import DEFAULT
from rapid.runtime.edge_metrics import EdgeMetrics
from rapid.runtime.generate import encode_messages, encode_prompt
from rapid.runtime.link import CloudError
from rapid.runtime.openai_logprobs import TokenLogprob
from rapid.runtime.policies import get_policy
from rapid.runtime.session import EdgeSession
from rapid.runtime.telemetry import time_per_output_token
from rapid.runtime.text_stream import TextStream

log = logging.getLogger("rapid.edge.daemon")


class _Abort(Exception):
    """Raised inside the coordinator's token callback to end a generation at a round boundary."""


@dataclass(slots=True)
class Request:
    prompt_ids: list[int]
    max_tokens: int | None  # None: until EOS or the context limit (``default_max_tokens``)
    temperature: float
    top_p: float
    seed: int
    stop: list[str]
    top_k: int = 0
    logprobs: int = -1  # -1: none; k >= 0: every token's log-probability and its top k


@dataclass(slots=True)
class Result:
    text: str = ""
    finish_reason: str = "length"
    completion_tokens: int = 0
    error: str | None = None
    status: int = 502  # HTTP status of ``error`` (``http_error``)
    error_type: str = "cloud_error"
    error_code: str | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # of the tokens sent (with logprobs)
    pieces: asyncio.Queue = field(default_factory=asyncio.Queue)  # Piece objects, then None


def http_error(e: Exception) -> tuple[int, str, str | None]:
    """(HTTP status, OpenAI error type, code) of a failed generation.

    ContextFullError (draft or cloud context), or the cloud's ``context`` error (a prompt longer
    than its context) → 400 context_length_exceeded; the cloud's verdict deadline → 504; the
    cloud full → 503; every other cloud error → 502."""
    if isinstance(e, ContextFullError) or (isinstance(e, CloudError) and e.code == "context"):
        return 400, "invalid_request_error", "context_length_exceeded"
    if isinstance(e, CloudError) and e.code == "deadline":
        return 504, "cloud_error", "timeout"
    if isinstance(e, CloudError) and e.code == "full":
        return 503, "cloud_error", "cloud_full"
    return 502, "cloud_error", None


HEALTH_TTL_S = 2.0  # /health re-checks the cloud at most this often


def probe_cloud(url: str, ssl: ssl_mod.SSLContext | None = None, timeout: float = 2.0) -> str | None:
    """None when the verifier at ``url`` (ws:// or wss://) answers ``GET /health`` with 200, else
    one line saying why not."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("ws", "wss") or not parts.hostname:
        return f"the cloud URL {url!r} is not ws://HOST:PORT or wss://HOST:PORT"
    scheme = "https" if parts.scheme == "wss" else "http"
    try:
        with urllib.request.urlopen(f"{scheme}://{parts.netloc}/health", timeout=timeout, context=ssl) as r:
            return None if r.status == 200 else f"the cloud answered /health with HTTP {r.status}"
    except urllib.error.HTTPError as e:
        return f"the cloud answered /health with HTTP {e.code}"
    except (OSError, ValueError) as e:
        return f"the cloud at {url} is unreachable ({type(e).__name__}: {e})"


class EdgeService:
    """The engine pool, one cloud session per request, stop strings, streaming pieces."""

    def __init__(self, edges: list, cloud: str, *, policy: str = DEFAULT.policy, tree=None, token: str | None = None,
                 ssl=None, model_name: str = "rapid", link_options: dict | None = None) -> None:
        self.edges = edges
        self.tokenizer = edges[0].tokenizer
        self.cloud, self.ssl = cloud, ssl  # the probe's; each session holds its own token and TLS
        self.policy = get_policy(policy)
        self.tree = tree or DEFAULT.tree()  # the edge commands' tree
        self.model_name = model_name
        self.link_options = link_options or {}
        self.metrics = EdgeMetrics()
        self._pool: asyncio.Queue | None = None
        # one session per engine: its depth controller is kept across requests (rapid.runtime.session)
        self.sessions = {id(e): EdgeSession(e, cloud, policy=self.policy, tree=self.tree, token=token, ssl=ssl,
                                            link_options=self.link_options) for e in edges}
        self._health: tuple[float, str | None] | None = None  # (checked at, problem) for /health

    def close(self) -> None:
        """End every session's worker threads (after the requests in flight; the daemon's exit)."""
        for s in self.sessions.values():
            s.close()

    async def cloud_problem(self) -> str | None:
        """Why the cloud cannot serve now (``probe_cloud``), re-checked at most every HEALTH_TTL_S."""
        now = time.monotonic()
        if self._health is None or now - self._health[0] >= HEALTH_TTL_S:
            self._health = (now, await asyncio.to_thread(probe_cloud, self.cloud, self.ssl))
        return self._health[1]

    def pool(self) -> asyncio.Queue:
        if self._pool is None:
            self._pool = asyncio.Queue()
            for e in self.edges:
                self._pool.put_nowait(e)
        return self._pool

    def encode_chat(self, messages: list[dict]) -> list[int]:
        """``messages``: ``{"role", "content"}`` dicts with text content (validated by the API)."""
        return encode_messages(self.tokenizer, [{"role": m["role"], "content": m["content"]} for m in messages])

    def encode_text(self, prompt: str) -> list[int]:
        return encode_prompt(self.tokenizer, prompt, chat=False)

    def start(self, req: Request) -> tuple[Result, asyncio.Event, asyncio.Task]:
        res, abort = Result(), asyncio.Event()
        task = asyncio.get_running_loop().create_task(self._generate(req, res, abort))
        return res, abort, task

    async def _generate(self, req: Request, res: Result, abort: asyncio.Event) -> None:
        pool = self.pool()
        t_start = time.perf_counter()
        self.metrics.prompt_tokens.inc(len(req.prompt_ids))
        self.metrics.waiting.inc()
        try:
            edge = await pool.get()
        finally:
            self.metrics.waiting.dec()
        self.metrics.active.inc()
        session = self.sessions[id(edge)]
        link = session.link()
        t_first: list[float] = []  # when the first text piece went out

        def first_piece() -> None:
            t_first.append(time.perf_counter())
            self.metrics.ttft.observe(t_first[0] - t_start)

        stream = TextStream(self.tokenizer, req.stop, res.pieces, first_piece)

        def on_tokens(ids: list[int]) -> None:
            res.completion_tokens += len(ids)
            if stream.push(ids):
                res.finish_reason = "stop"
                raise _Abort
            if abort.is_set():
                res.finish_reason = "abandoned"
                raise _Abort

        try:
            sampling = SamplingParams(req.temperature, req.top_p, req.top_k, req.seed)
            max_new = req.max_tokens or default_max_tokens(edge.engine.info.capacity, len(req.prompt_ids), self.tree)
            try:  # no max_tokens: until EOS or min(edge, cloud) context (the cloud's from its Ready)
                gen = await session.generate(req.prompt_ids, max_new, sampling, on_tokens, logprobs=req.logprobs,
                                             fit_cloud=req.max_tokens is None, on_scores=stream.scored.extend, link=link)
            except _Abort:
                pass
            else:
                res.finish_reason = "stop" if gen.stopped else "length"
                if stream.finish():
                    res.finish_reason = "stop"
                self.metrics.observe(gen.records, link.stats, str(self.edges.index(edge)))
        except RapidError as e:
            res.error = str(e)
            res.status, res.error_type, res.error_code = http_error(e)
            log.warning("generation failed: %s", e)
        except Exception as e:  # noqa: BLE001 — reported to the client, the daemon stays up
            log.exception("generation failed")
            res.error = f"{type(e).__name__}: {e}"
        finally:  # the session has closed its link (Bye: the cloud frees the KV now)
            pool.put_nowait(edge)
            self.metrics.active.dec()
            res.text = stream.text_sent if res.finish_reason in ("stop", "abandoned") else stream.full
            res.logprobs = stream.logprobs
            self.metrics.tokens.inc(res.completion_tokens)
            t_end = time.perf_counter()
            self.metrics.e2e.observe(t_end - t_start)
            tpot = time_per_output_token(t_end, t_first[0] if t_first else None, res.completion_tokens)
            if tpot is not None:
                self.metrics.tpot.observe(tpot)
            res.pieces.put_nowait(None)
