"""Batched verification: trees of several sessions in one target forward.

Trees that arrive within ``window_s`` of each other (at most ``max_batch``) are verified together.
Row b of the batch is session b's ``[root] + nodes`` (``T_b = 1 + N_b`` tokens) padded to
``T = max T_b``; its keys are the session's own KV (``P_b`` entries) followed by its ``T_b`` new
entries, padded to ``S = max(P_b + T_b)``. The mask of row b is exactly the single-session tree
mask (``rapid.server.target.TargetSession.tree_inputs``) in the top-left corner, everything else blocked,
so each row computes what that session alone would compute; the padding never reaches a real
row. After the forward every session picks, accepts and compacts on its own, as in
``TargetSession.verify``.

A batch of one takes ``TargetSession.verify`` itself (bit-identical to the unbatched server).
Each session has at most one tree in flight (the server holds a per-session lock), so a
session never appears twice in a batch.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

import torch

from rapid.acceptance import Verdict
from rapid.modeling import additive_mask
from rapid.server.target import BadTreeError, TargetSession


class _BatchKV:
    """``KVStore`` over the sessions' own ``StaticKV``s: writes each row's new entries into its
    session's buffer and hands the layer a padded ``[B, KVH, S, d]`` view."""

    def __init__(self, kvs, new_lens: Sequence[int]) -> None:
        self.kvs = kvs
        self.new = list(new_lens)
        self.past = [kv.length for kv in kvs]
        self.s = max(p + t for p, t in zip(self.past, self.new, strict=True))

    def attend_kv(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor):
        b_, h, _, d = k_new.shape
        k_out = k_new.new_zeros((b_, h, self.s, d))
        v_out = v_new.new_zeros((b_, h, self.s, d))
        for b, kv in enumerate(self.kvs):
            p, t = self.past[b], self.new[b]
            kv.k[layer, :, p:p + t] = k_new[b, :, :t]
            kv.v[layer, :, p:p + t] = v_new[b, :, :t]
            k_out[b, :, :p + t] = kv.k[layer, :, :p + t]
            v_out[b, :, :p + t] = kv.v[layer, :, :p + t]
        return k_out, v_out


def verify_batch(items: Sequence[tuple[TargetSession, Sequence[int], Sequence[int]]]) -> list[Verdict | Exception]:
    """Verify one tree per (distinct) session; a bad tree fails alone, the others go on."""
    if len(items) == 1:
        s, tokens, parents = items[0]
        try:
            return [s.verify(tokens, parents)]
        except Exception as e:  # noqa: BLE001 — reported to that session only
            return [e]
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
    if len(rows) == 1 or any(items[i][0].mode == "sequential" for i in rows):
        results = _one_by_one([items[i] for i in rows])
    else:
        try:
            results = _forward_rows([items[i] for i in rows]) if rows else []
        except Exception:  # noqa: BLE001 — nothing was committed: verify the rows one by one, so
            results = _one_by_one([items[i] for i in rows])  # a crash stays with its session
    for i, v in zip(rows, results, strict=True):
        out[i] = v
    return out  # type: ignore[return-value]


def _one_by_one(items) -> list[Verdict | Exception]:
    results: list[Verdict | Exception] = []
    for s, tokens, parents in items:
        try:
            results.append(s.verify(tokens, parents))
        except Exception as e:  # noqa: BLE001 — reported to that session only
            results.append(e)
    return results


def forward_batch(items) -> tuple[torch.Tensor, list[list[int]], list[int]]:
    """One forward over the sessions' trees: logits ``[B, T, V]``, each row's positions and KV
    length before it. The new KV entries are written but not committed (the caller does)."""
    model = items[0][0].model
    b_ = len(items)
    ids_l, pos_l, allowed_l, kv_lens = [], [], [], []
    for s, tokens, parents in items:
        ids, pos, allowed = s.tree_inputs(tokens, parents)
        ids_l.append(ids)
        pos_l.append(pos)
        allowed_l.append(allowed)
        kv_lens.append(s.kv.length)
    t_max = max(max(len(x) for x in ids_l), items[0][0].min_rows)  # per-row GEMMs of M >= 2 in bf16
    kv = _BatchKV([s.kv for s, _, _ in items], [len(x) for x in ids_l])
    ids = torch.zeros((b_, t_max), dtype=torch.long)
    pos = torch.zeros((b_, t_max), dtype=torch.long)
    allowed = torch.zeros((b_, t_max, kv.s), dtype=torch.bool)
    for b in range(b_):
        t = len(ids_l[b])
        ids[b, :t] = torch.as_tensor(ids_l[b])
        pos[b, :t] = torch.as_tensor(pos_l[b])
        allowed[b, :t, : allowed_l[b].shape[1]] = torch.from_numpy(allowed_l[b])
        allowed[b, t:, 0] = True  # padding rows: attend to something (their output is unused)
    dev = items[0][0].device  # the target may live on a GPU
    ids, pos = ids.to(dev), pos.to(dev)
    mask = additive_mask(allowed.to(dev), model.dtype)[0, 0][:, None]  # [B, 1, T, S]
    for (s, _, _), t in zip(items, kv.new, strict=True):
        s.kv.begin(t)
    with torch.inference_mode():
        logits = model(ids, pos, mask, kv)  # [B, T, V]
    return logits, pos_l, kv_lens


def _forward_rows(items) -> list[Verdict | Exception]:
    """The batched forward; raises only before any session state changed."""
    logits, pos_l, kv_lens = forward_batch(items)
    verdicts: list[Verdict | Exception] = []
    for b, (s, tokens, parents) in enumerate(items):
        t = len(pos_l[b])
        kv_len = kv_lens[b]
        try:
            verdict = s.decide(logits[b, :t].float().cpu().numpy(), pos_l[b], tokens, parents)
        except Exception as e:  # noqa: BLE001 — this row only; its KV stays at kv_len
            s.kv._pending = 0
            verdicts.append(e)
            continue
        s.kv.commit(t)
        s.forwards += 1
        s.advance(verdict, tokens, kv_len)
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
                 on_batch: Callable[[int, float], None] | None = None) -> None:
        if max_batch < 1 or window_s < 0:
            raise ValueError("max_batch >= 1 and window >= 0")
        self.pool = pool
        self.window_s = window_s
        self.max_batch = max_batch
        self.on_batch = on_batch  # (batch size, forward seconds)
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
                results = await loop.run_in_executor(self.pool, verify_batch,
                                                     [(j.session, j.tokens, j.parents) for j in batch])
            except Exception as e:  # noqa: BLE001 — never let the loop die
                results = [e] * len(batch)
            if self.on_batch is not None:
                self.on_batch(len(batch), time.perf_counter() - t0)
            for j, r in zip(batch, results, strict=True):
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
