"""Batched verification: trees of several sessions in one target forward.

Trees that arrive within ``window_s`` of each other (at most ``max_batch``) are verified together.
Each session's tree is laid out as root-to-leaf chains (``rapid.server.chains``), and the chains
of all sessions are the batch rows of one forward: row b sees its session's KV followed by its
own chain, causally, padded at the end, so each row computes exactly what that session's
one-token step would (bitwise in bf16). After the forward every session picks, accepts and
commits its accepted chain on its own, as in ``TargetSession.verify``.

A batch of one takes ``TargetSession.verify`` itself (bit-identical to the unbatched server).
Each session has at most one tree in flight (the server holds a per-session lock), so a
session never appears twice in a batch. If the batched forward itself fails (nothing was
committed), the trees are verified one by one so a crash stays with its session; that split is
reported (``BatchOutcome.error``: logged and counted by the server), and the batch-size metric
then sees forwards of one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

from rapid.core.acceptance import Verdict
from rapid.server.chains import forward_chains
from rapid.server.target import BadTreeError, TargetSession


@dataclass(slots=True)
class BatchOutcome:
    results: list[Verdict | Exception]  # [B] one per item, in order
    forwards: list[int]  # trees per target forward that ran (sizes for the batch-size metric)
    error: Exception | None = None  # the batched forward failed and was split into single trees


def verify_batch(items: Sequence[tuple[TargetSession, Sequence[int], Sequence[int]]]) -> BatchOutcome:
    """Verify one tree per (distinct) session; a bad tree fails alone, the others go on."""
    if len(items) == 1:
        s, tokens, parents = items[0]
        try:
            return BatchOutcome([s.verify(tokens, parents)], [1])
        except Exception as e:  # noqa: BLE001 — reported to that session only
            return BatchOutcome([e], [1])
    out: list[Verdict | Exception | None] = [None] * len(items)
    rows = []
    for i, (s, tokens, parents) in enumerate(items):
        try:
            why = s.check_tree(tokens, parents)
        except Exception as e:  # noqa: BLE001 — a broken session fails alone
            out[i] = e
            continue
        if why:
            out[i] = BadTreeError(why)
        else:
            rows.append(i)
    error = None
    if len(rows) <= 1 or any(items[i][0].mode == "sequential" for i in rows):
        results, forwards = _one_by_one([items[i] for i in rows]), [1] * len(rows)
    else:
        try:
            results, forwards = _forward_rows([items[i] for i in rows]), [len(rows)]
        except Exception as e:  # noqa: BLE001 — nothing was committed: verify the rows one by one, so
            error = e  # a crash stays with its session
            results, forwards = _one_by_one([items[i] for i in rows]), [1] * len(rows)
    for i, v in zip(rows, results, strict=True):
        out[i] = v
    return BatchOutcome(out, forwards, error)  # type: ignore[arg-type]


def _one_by_one(items) -> list[Verdict | Exception]:
    results: list[Verdict | Exception] = []
    for s, tokens, parents in items:
        try:
            results.append(s.verify(tokens, parents))
        except Exception as e:  # noqa: BLE001 — reported to that session only
            results.append(e)
    return results


def _forward_rows(items) -> list[Verdict | Exception]:
    """The batched forward (every session's chains, ``rapid.server.chains``); raises only before
    any session state changed."""
    sessions = [s for s, _, _ in items]
    results = forward_chains(sessions[0].model, [s.chain_job(t, p) for s, t, p in items])
    verdicts: list[Verdict | Exception] = []
    for s, (_, tokens, parents), result in zip(sessions, items, results, strict=True):
        try:
            verdict = s.decide(s.logits(result), result.positions, tokens, parents)
        except Exception as e:  # noqa: BLE001 — this row only; its KV is untouched
            verdicts.append(e)
            continue
        s.forwards += 1
        s.commit(result, verdict, tokens)
        verdicts.append(verdict)
    return verdicts


@dataclass(slots=True)
class _Job:
    session: TargetSession
    tokens: list[int]
    parents: list[int]
    future: asyncio.Future
    t_arrival: float = field(default_factory=time.perf_counter)


class Batcher:
    """Collects verification jobs on the event loop and runs them as batches on ``pool``."""

    def __init__(self, pool: Executor, window_s: float, max_batch: int,
                 on_batch: Callable[[int, float], None] | None = None,
                 on_split: Callable[[int, Exception], None] | None = None) -> None:
        if max_batch < 1 or window_s < 0:
            raise ValueError("max_batch >= 1 and window >= 0")
        self.pool = pool
        self.window_s = window_s
        self.max_batch = max_batch
        self.on_batch = on_batch  # (trees in one forward, seconds), per forward
        self.on_split = on_split  # (batch size, the batched forward's exception)
        self._jobs: list[_Job] = []
        self._wake: asyncio.Event | None = None
        self._full: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    def _ensure(self) -> None:
        if self._task is None or self._task.done():
            self._wake, self._full = asyncio.Event(), asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._loop())

    async def submit(self, session: TargetSession, tokens: Sequence[int], parents: Sequence[int]) -> Verdict:
        self._ensure()
        fut = asyncio.get_running_loop().create_future()
        self._jobs.append(_Job(session, list(tokens), list(parents), fut))
        self._wake.set()
        if len(self._jobs) >= self.max_batch:
            self._full.set()
        return await fut

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            if self.window_s > 0 and len(self._jobs) < self.max_batch:
                try:
                    await asyncio.wait_for(self._full.wait(), self.window_s)
                except TimeoutError:
                    pass
            batch, self._jobs = self._jobs[: self.max_batch], self._jobs[self.max_batch:]
            if not self._jobs:
                self._wake.clear()
            if len(self._jobs) < self.max_batch:
                self._full.clear()
            if not batch:
                continue
            t0 = time.perf_counter()
            try:
                outcome = await loop.run_in_executor(self.pool, verify_batch,
                                                     [(j.session, j.tokens, j.parents) for j in batch])
            except Exception as e:  # noqa: BLE001 — never let the loop die
                outcome = BatchOutcome([e] * len(batch), [], e)
            if outcome.error is not None and self.on_split is not None:
                self.on_split(len(batch), outcome.error)
            if self.on_batch is not None and outcome.forwards:
                seconds = (time.perf_counter() - t0) / len(outcome.forwards)
                for size in outcome.forwards:
                    self.on_batch(size, seconds)
            for j, r in zip(batch, outcome.results, strict=True):
                if j.future.done():
                    continue
                if isinstance(r, Exception):
                    j.future.set_exception(r)
                else:
                    j.future.set_result(r)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
