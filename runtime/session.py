"""One edge's way to the cloud: :class:`EdgeSession` — the path every edge request takes.

    session = EdgeSession(model, "ws://cloud:8765", policy="rapid", tree=DEFAULT.tree(), token=…)
    gen = await session.generate(prompt_ids, max_new=64)            # a Generation (tokens, records, …)
    gen, text = await session.generate_text(prompt_ids, 64, stream=sys.stdout)

Each call is one cloud session: a fresh ``CloudLink`` (token, TLS, the draft's tokenizer
fingerprint), the Coordinator's rounds (draft → send → await → apply; the committed tokens are
one ``Transcript``, appended by the drafter, read by the link and the output), and the session closed (Bye) however the call ends. The depth controller is the
session's and is kept across calls (``controller``): its latency baseline is the device's, so
contention that began before a request is still seen as contention. ``rapid generate``, the
Python API (``rapid.runtime.api.Edge``), ``rapid edge`` (one session per engine) and
``rapid bench`` (one per engine and policy) all go through here.

A session owns two worker threads; ``close()`` (or ``with EdgeSession(...) as session:``) ends
them once no step is left running. A closed session refuses further requests.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TextIO

from rapid.core.errors import SessionClosedError
from rapid.core.sampling import SamplingParams
from rapid.runtime.assembly import assemble
from rapid.runtime.coordinator import CoordinatorConfig, Generation, controller_for
from rapid.runtime.depth_control import DepthController
from rapid.runtime.detok import Detokenizer
from rapid.runtime.edge_config import DEFAULT
from rapid.runtime.link import CloudLink
from rapid.runtime.policies import Policy, get_policy
from rapid.runtime.token_scores import TokenScore
from rapid.runtime.tree import TreeParams


class EdgeSession:
    def __init__(self, model: Any, cloud: str, *, policy: Policy | str = DEFAULT.policy, tree: TreeParams | None = None,
                 token: str | None = None, ssl: Any = None, link_options: dict | None = None,
                 controller: DepthController | None = None) -> None:
        """``model``: an ``EdgeModel`` (engine, tokenizer, stop ids, fingerprint); ``controller``:
        a depth controller to carry (default: a new one for ``policy``, carried from here on)."""
        self.model, self.cloud = model, cloud
        self.policy = get_policy(policy) if isinstance(policy, str) else policy
        self.tree = tree or DEFAULT.tree()
        self.token, self.ssl = token, ssl
        self.link_options = link_options or {}
        self.config = CoordinatorConfig(depth=self.tree.depth)
        self.controller = controller if controller is not None else controller_for(self.policy, self.config)
        # the session's own worker threads (one drafting step at a time, a spare for a draining one):
        # with many sessions in one process, asyncio's default pool (cores + 4) would queue their steps
        self.workers = ThreadPoolExecutor(2, thread_name_prefix="rapid-draft")
        self.closed = False

    def close(self) -> None:
        """End the worker threads, after any drafting step still running (idempotent)."""
        self.closed = True
        self.workers.shutdown(wait=True)

    def __enter__(self) -> EdgeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def link(self) -> CloudLink:
        return CloudLink(self.cloud, token=self.token, ssl=self.ssl, tokenizer=self.model.fingerprint,
                         **self.link_options)

    async def generate(self, prompt_ids: list[int], max_new: int, sampling: SamplingParams | None = None,
                       on_tokens: Callable[[list[int]], None] | None = None, *, logprobs: int = -1,
                       fit_cloud: bool = False, on_scores: Callable[[list[TokenScore]], None] | None = None,
                       link: CloudLink | None = None) -> Generation:
        """One request (see the module docstring and ``Coordinator.generate``); ``link``: one made
        by the caller (to read its stats afterwards), else the session's own."""
        if self.closed:
            raise SessionClosedError(f"edge session to {self.cloud} is closed; open a new EdgeSession")
        link = link or self.link()
        try:
            coord = assemble(self.model.engine, self.tree, self.model.stop_ids, link, self.policy, self.config,
                             self.controller, executor=self.workers)
            return await coord.generate(prompt_ids, max_new, sampling or SamplingParams(), on_tokens,
                                        logprobs=logprobs, fit_cloud=fit_cloud, on_scores=on_scores)
        finally:
            await link.close()  # Bye: the cloud frees the session's KV now (a no-op if already closed)

    async def generate_text(self, prompt_ids: list[int], max_new: int, sampling: SamplingParams | None = None, *,
                            stream: TextIO | None = None, logprobs: int = -1) -> tuple[Generation, str]:
        """``generate`` and its text, written to ``stream`` (a file) piece by piece as tokens commit."""
        detok = Detokenizer(self.model.tokenizer)
        pieces: list[str] = []

        def emit(piece: str) -> None:
            if piece:
                pieces.append(piece)
                if stream is not None:
                    stream.write(piece)
                    stream.flush()

        gen = await self.generate(prompt_ids, max_new, sampling, lambda ids: emit(detok.push(ids)),
                                  logprobs=logprobs)
        emit(detok.flush())
        return gen, "".join(pieces)
