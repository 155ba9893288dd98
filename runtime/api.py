"""The Python API of the edge: :class:`Edge` — a draft engine and a cloud verifier URL.

    from rapid.runtime.api import Edge

    edge = Edge("ws://127.0.0.1:8765", draft="default-draft-int4")
    print(edge.generate("def fibonacci(n):", max_tokens=48).text)      # blocking

    async for piece in edge.stream("Explain a hash map.", chat=True):  # inside a coroutine
        print(piece, end="")

Every call is one cloud session; the output is exactly what the target alone would emit
(greedy, or sampling seeded by ``seed``). One ``Edge`` holds one engine, so its calls run one at
a time (later ones wait); make several ``Edge`` objects — or run ``rapid edge --parallel N`` — for
concurrency. ``with Edge(...) as edge:`` (or ``edge.close()``) ends its worker threads.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

from rapid.core.auth import client_ssl_context, load_token
from rapid.core.sampling import SamplingParams
from rapid.runtime.edge_config import DEFAULT
from rapid.runtime.generate import encode_prompt, open_edge_model
from rapid.runtime.session import EdgeSession
from rapid.runtime.telemetry import Summary
from rapid.runtime.token_scores import TokenScore
from rapid.runtime.tree import TreeParams


@dataclass(slots=True)
class Completion:
    text: str
    tokens: list[int]  # the generated token ids
    stopped: bool  # ended on a stop token (else max_tokens)
    summary: Summary  # rounds, acceptance, tok/s, time to the first verdict (ttft_s) and the rate after it
    scores: list[TokenScore]  # per token: the target's log-probability and top alternatives (logprobs >= 0)


class _Pieces:
    """A file-like sink (``write``/``flush``) that hands text pieces to an asyncio queue."""

    def __init__(self, queue: asyncio.Queue) -> None:
        self.queue = queue

    def write(self, piece: str) -> None:
        self.queue.put_nowait(piece)

    def flush(self) -> None:
        pass


class Edge:
    """See the module docstring. ``token`` (else ``$RAPID_TOKEN``) and ``cafile`` as for
    ``rapid edge``; ``tree`` and ``policy`` as the CLI's ``--depth/--budget/...`` and ``--policy``."""

    def __init__(self, cloud: str, draft: str = DEFAULT.draft, *, backend: str = DEFAULT.engine,
                 capacity: int = DEFAULT.capacity, threads: int = DEFAULT.threads, policy: str = DEFAULT.policy,
                 tree: TreeParams | None = None,
                 token: str | None = None, cafile: str | None = None) -> None:
        self.cloud = cloud
        self.model = open_edge_model(draft, backend, capacity, threads)
        self.session = EdgeSession(self.model, cloud, policy=policy, tree=tree or DEFAULT.tree(),
                                   token=token if token is not None else load_token(None),
                                   ssl=client_ssl_context(cloud, cafile))
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    def close(self) -> None:
        """End the session's worker threads; the ``Edge`` refuses calls afterwards."""
        self.session.close()

    def __enter__(self) -> Edge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def tokenizer(self):
        return self.model.tokenizer

    def generate(self, prompt: str | list[int], *, max_tokens: int = DEFAULT.max_tokens, chat: bool = False,
                 temperature: float = DEFAULT.temperature, top_p: float = DEFAULT.top_p, top_k: int = DEFAULT.top_k,
                 seed: int = DEFAULT.seed,
                 logprobs: int = -1) -> Completion:
        """Blocking: the whole completion (not from inside a running event loop: use ``agenerate``)."""
        return asyncio.run(self.agenerate(prompt, max_tokens=max_tokens, chat=chat, temperature=temperature,
                                          top_p=top_p, top_k=top_k, seed=seed, logprobs=logprobs))

    async def agenerate(self, prompt: str | list[int], *, max_tokens: int = DEFAULT.max_tokens, chat: bool = False,
                        temperature: float = DEFAULT.temperature, top_p: float = DEFAULT.top_p,
                        top_k: int = DEFAULT.top_k, seed: int = DEFAULT.seed,
                        logprobs: int = -1, _sink=None) -> Completion:
        """The whole completion, awaited; ``prompt`` is text (``chat``: wrapped in the chat
        template) or token ids. ``logprobs`` = k >= 0 (at most 20) fills ``Completion.scores``: the
        target's log-probability of every token (raw logits, exact) and its k most likely tokens."""
        ids = list(prompt) if isinstance(prompt, list) else encode_prompt(self.tokenizer, prompt, chat)
        sampling = SamplingParams(temperature, top_p, top_k, seed)
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:  # an asyncio.Lock belongs to one loop
            self._lock = (loop, asyncio.Lock())
        async with self._lock[1]:  # one engine: one generation at a time
            gen, text = await self.session.generate_text(ids, max_tokens, sampling, stream=_sink, logprobs=logprobs)
        return Completion(text, gen.tokens, gen.stopped, gen.summary, gen.scores)

    async def stream(self, prompt: str | list[int], **kw) -> AsyncIterator[str]:
        """Text pieces as the cloud commits tokens (same keywords as ``agenerate``)."""
        queue: asyncio.Queue = asyncio.Queue()
        task = asyncio.ensure_future(self.agenerate(prompt, _sink=_Pieces(queue), **kw))
        task.add_done_callback(lambda _: queue.put_nowait(None))
        try:
            while (piece := await queue.get()) is not None:
                yield piece
            task.result()  # re-raise a failure after the pieces that did arrive
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
