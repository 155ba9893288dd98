"""Tree verification as root-to-leaf chains: every row bitwise a one-token step, every node
computed once.

A tree of N nodes over a session's committed prefix is 1 + N *unique rows* (root, nodes); a
batch of several sessions' trees is their rows back to back. Row ``u``'s keys are its session's
prefix followed by its ancestors' new keys and its own in depth order (read off the root-to-leaf
chains): exactly the keys, in the same order, that a one-token step of ``u``'s
token sees after its ancestors were committed. A tree with "holes" (node 5 of
``parents = [-1, 0, 0, 1, 2, 3]`` sees 0, 1, 3 but not 2 and 4) needs no special layout: a row
lists its own ancestors, never a masked sibling whose count could regroup a sum.

The forward runs on the row-invariant kernels where they are built (``row_forward``: a CPU
target in float32 / bfloat16; invariant by construction) and otherwise on library kernels called
at fixed shapes only (``block_forward``: a CUDA target, float64; position within a block is what
``invariance.position_probe`` enumerates). Nothing is written into a session's KV during the
forward: ``commit`` copies the accepted rows' keys/values afterwards, so a failed forward changes
nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch

from rapid.engines.rowops import RowKeys
from rapid.kvcache import StaticKV
from rapid.modeling import Decoder
from rapid.server import block_forward, row_forward
from rapid.server.block_forward import RowChain
from rapid.server.row_forward import NewKV


def leaf_chains(parents: Sequence[int]) -> list[list[int]]:
    """Tree rows (0 = root, 1 + j = node j) of every root-to-leaf path, in leaf order."""
    n = len(parents)
    inner = set(parents)
    chains = []
    for leaf in (j for j in range(n) if j not in inner):
        path, x = [], leaf
        while x >= 0:
            path.append(1 + x)
            x = parents[x]
        chains.append([0, *path[::-1]])
    return chains or [[0]]


@dataclass(slots=True)
class ChainJob:
    """One session's tree, laid out as chains."""

    kv: StaticKV  # the session's committed KV (the prefix every chain sees)
    ids: list[int]  # [1+N] tree row tokens: root, nodes
    positions: list[int]  # [1+N]
    chains: list[list[int]]  # [C][L_c] tree rows per chain


@dataclass(slots=True)
class ChainResult:
    logits: torch.Tensor | None  # [1+N, V] tree rows (None: not projected)
    positions: list[int]  # [1+N]
    kv: NewKV  # the batch's new entries
    offset: int  # this job's first unique row in the batch
    chains: list[list[int]]  # [C][L_c] this job's tree rows per chain


def row_keys(jobs: Sequence[ChainJob]) -> RowKeys:
    """Every unique row's keys for ``row_forward``: its session's prefix, then its ancestors and
    itself in depth order (the first chain holding the row gives the path; a prefill's one chain
    of n rows lists n·(n+1)/2 indices, built as numpy views)."""
    offsets = list(accumulate((len(job.ids) for job in jobs), initial=0))
    anc: list[np.ndarray | None] = [None] * offsets[-1]
    base_k, base_v, plen, head, layer = [], [], [], [], []
    for j, job in enumerate(jobs):
        for chain in job.chains:
            rows = np.asarray(chain, dtype=np.int64) + offsets[j]
            for i, u in enumerate(rows.tolist()):
                if anc[u] is None:
                    anc[u] = rows[:i + 1]
        kv, n = job.kv, len(job.ids)
        base_k += [kv.k.data_ptr()] * n
        base_v += [kv.v.data_ptr()] * n
        plen += [kv.length] * n
        head += [kv.k.shape[2] * kv.k.shape[3]] * n
        layer += [kv.k.shape[1] * kv.k.shape[2] * kv.k.shape[3]] * n
    if any(a is None for a in anc):
        raise ValueError("row_keys: a tree row is on no chain")
    t = lambda xs: torch.as_tensor(xs, dtype=torch.long)  # noqa: E731
    lengths = np.fromiter((len(a) for a in anc), dtype=np.int64, count=len(anc))
    return RowKeys(t(base_k), t(base_v), t(plen), t(head), t(layer), jobs[0].kv.k.element_size(),
                   torch.from_numpy(np.concatenate(([0], np.cumsum(lengths)))),
                   torch.from_numpy(np.concatenate(anc)))


def forward_chains(model: Decoder, jobs: Sequence[ChainJob], logits: bool = True) -> list[ChainResult]:
    """One forward over every tree row of every job (jobs back to back): on the row-invariant
    kernels (``row_forward.enabled``) or else on fixed-shape library calls (``block_forward``);
    in both, each row attends its own key list. ``logits=False`` (a prefill) skips the LM head."""
    offsets = list(accumulate((len(job.ids) for job in jobs), initial=0))
    ids = [t for job in jobs for t in job.ids]
    pos = [p for job in jobs for p in job.positions]
    rows = range(len(ids)) if logits else None
    if row_forward.enabled(model):
        out, new = row_forward.forward_rows(model, ids, pos, row_keys(jobs), jobs[0].kv.k.dtype, rows)
    else:
        chains = [RowChain(job.kv, [offsets[j] + r for r in chain]) for j, job in enumerate(jobs) for chain in job.chains]
        out, new = block_forward.forward_blocks(model, ids, pos, chains, rows)
    return [ChainResult(out[offsets[j]:offsets[j + 1]] if logits else None, job.positions, new, offsets[j], job.chains)
            for j, job in enumerate(jobs)]


def commit(result: ChainResult, target: StaticKV, path_rows: Sequence[int]) -> None:
    """Append the KV of tree rows ``path_rows`` (root first, then the accepted path: a prefix of
    some chain) from ``result`` to ``target``."""
    n = len(path_rows)
    if not any(ch[:n] == list(path_rows) for ch in result.chains):
        raise ValueError(f"commit: rows {list(path_rows)} are not a root path of this tree")
    p = target.length
    if p + n > target.capacity:
        raise ValueError(f"commit: {n} entries from {p} exceed capacity {target.capacity}")
    rows = torch.as_tensor([result.offset + r for r in path_rows], device=result.kv.new_k[0].device)
    for layer, (k, v) in enumerate(zip(result.kv.new_k, result.kv.new_v, strict=True)):
        target.k[layer, :, p:p + n] = k[0][:, rows]
        target.v[layer, :, p:p + n] = v[0][:, rows]
    target.length = p + n
