"""Tree verification as root-to-leaf chains: every row bitwise a one-token step, every node
computed once.

On the CPU, ``forward_chains`` runs ``rapid.server.row_forward`` (kernels invariant by
construction: each row attends its own key list, so no chain layout is needed there). What
follows is the torch forward, used where those kernels do not run (a CUDA target, float64, no
native library), whose invariance ``rapid.server.invariance.thorough_probe`` measures.

A tree forward with an ancestor mask leaves *holes* in a row's keys: node 5 of
``parents = [-1, 0, 0, 1, 2, 3]`` sees the prefix, the root and nodes 0, 1, 3 but not 2 and 4,
which sit between them. The one-token step of the same prefix sees those keys contiguously.
A masked key contributes an exact zero, but *where* the non-zeros sit changes how the softmax
sum and the ``probs @ V`` reduction group them (vector lanes, K-blocks), so the row rounds
differently: measured on the bf16 1.5B target, 2 of 7 rows of that tree differed by up to 0.19
in the logits and a HumanEval output changed at token 46.

So the *attention* of each root-to-leaf path runs as its own *chain*, one batch row:

    chain c = [root, a_1, …, leaf_c]           keys: session prefix ‖ the chain's rows
    row i of chain c sees  prefix ‖ root, a_1 … a_i       (causal: only trailing masked keys)

exactly the layout of a one-token step after ``root, a_1 … a_{i-1}`` were committed. Everything
else (embeddings, norms, projections, MLP, LM head) is per row, so it runs once per *unique*
tree row: the forward's hidden states are ``[1, U, hidden]`` (U = every job's 1 + N rows back
to back), and ``ChainBatch`` gathers q/k/v into the chain layout ``[C, H, L, d]`` for attention
and scatters each row's output back from its first chain (any chain holding the row computes it
identically). A bushy tree therefore costs 1 + N projection rows, not C × L. Several sessions
batch the same way. Nothing is written into a session's KV during the forward: ``commit`` copies
the accepted rows' keys/values afterwards, so a failed forward changes nothing.

Every row is then the step's row given M-invariant GEMMs, which ``rapid.server.invariance``
measures. Every forward computes at least ``min_rows`` unique rows and chain slots, and attends
at least ``MIN_KEYS`` keys (masked zeros past a row's own): ATen picks the kernel of a bf16
``bmm`` by size (a naive loop below ``k·m·n`` = 400, oneDNN above ``b·m·k·n`` = 4096 with b =
chains × heads, per-matrix BLAS between), and the paths round differently on rare values
(measured: a tiny model's PV product hit an fp32 tie that oneDNN rounded down and BLAS up, so a
session's rows changed when another session joined its batch). With m ≥ 2 and S ≥ 64,
``b·m·k·n`` ≥ 128·heads·head_dim > 4096 for any model with heads·head_dim > 32: one path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np
import torch

from rapid.kvcache import StaticKV
from rapid.modeling import Decoder, additive_mask
from rapid.server import row_forward
from rapid.server.rowops import RowKeys

MIN_KEYS = 64  # fewest keys every row's attention spans (see the module docstring)


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


class ChainBatch:
    """``KVStore`` and ``RowLayout`` of one chain forward over U unique rows and C chains of L
    slots: chain c attends ``prefix_c ‖ its slots``; the new entries of every layer are kept
    (``new_k[layer]`` ``[1, KVH, U, d]``) for ``commit``."""

    def __init__(self, prefixes: Sequence[StaticKV], slots: Sequence[Sequence[int]], first: Sequence[int],
                 device: torch.device) -> None:
        self.prefixes = list(prefixes)  # [C] the session KV each chain extends
        self.past = [kv.length for kv in self.prefixes]  # [C]
        self.slots = torch.as_tensor(slots, dtype=torch.long, device=device)  # [C, L] unique row per slot
        self.first = torch.as_tensor(first, dtype=torch.long, device=device)  # [U] flat slot c·L + i read back
        self.s = max(MIN_KEYS, max(self.past) + self.slots.shape[1])
        self.new_k: list[torch.Tensor] = []
        self.new_v: list[torch.Tensor] = []

    def gather(self, t: torch.Tensor) -> torch.Tensor:
        """``[1, H, U, d]`` unique rows → ``[C, H, L, d]`` chain slots (contiguous)."""
        chains, width = self.slots.shape
        return t[0][:, self.slots.flatten()].view(t.shape[1], chains, width, t.shape[3]).transpose(0, 1).contiguous()

    def scatter(self, t: torch.Tensor) -> torch.Tensor:
        """``[C, H, L, d]`` chain slots → ``[1, H, U, d]``, each row from its first chain."""
        chains, heads, width, d = t.shape
        return t.transpose(0, 1).reshape(heads, chains * width, d)[:, self.first][None]

    def attend_kv(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor):
        self.new_k.append(k_new)
        self.new_v.append(v_new)
        k_c, v_c = self.gather(k_new), self.gather(v_new)  # [C, KVH, L, d]
        c, h, t, d = k_c.shape
        k_out = k_c.new_zeros((c, h, self.s, d))
        v_out = v_c.new_zeros((c, h, self.s, d))
        for b, kv in enumerate(self.prefixes):
            p = self.past[b]
            k_out[b, :, :p] = kv.k[layer, :, :p]
            v_out[b, :, :p] = kv.v[layer, :, :p]
            k_out[b, :, p:p + t] = k_c[b]
            v_out[b, :, p:p + t] = v_c[b]
        return k_out, v_out


@dataclass(slots=True)
class ChainResult:
    logits: torch.Tensor | None  # [1+N, V] tree rows, model dtype (None: not projected)
    positions: list[int]  # [1+N]
    kv: ChainBatch | row_forward.NewKV  # the batch's new entries
    offset: int  # this job's first unique row in the batch
    chains: list[list[int]]  # [C][L_c] this job's tree rows per chain


def _layout(jobs: Sequence[ChainJob], min_rows: int) -> tuple[list[int], list[tuple[int, list[int]]], int, int]:
    """Job offsets ``[J+1]``, (job, unique rows) per chain, slots per chain L, unique rows U."""
    offsets = list(accumulate((len(job.ids) for job in jobs), initial=0))
    chains = [(j, [offsets[j] + r for r in chain]) for j, job in enumerate(jobs) for chain in job.chains]
    width = max(max(len(c) for _, c in chains), min_rows)
    return offsets, chains, width, max(offsets[-1], min_rows)


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


def _forward_rows(model: Decoder, jobs: Sequence[ChainJob], logits: bool) -> list[ChainResult]:
    offsets = list(accumulate((len(job.ids) for job in jobs), initial=0))
    ids = [t for job in jobs for t in job.ids]
    pos = [p for job in jobs for p in job.positions]
    out, new = row_forward.forward_rows(model, ids, pos, row_keys(jobs), jobs[0].kv.k.dtype,
                                        range(len(ids)) if logits else None)
    return [ChainResult(out[offsets[j]:offsets[j + 1]] if logits else None, job.positions, new, offsets[j], job.chains)
            for j, job in enumerate(jobs)]


def forward_chains(model: Decoder, jobs: Sequence[ChainJob], min_rows: int,
                   logits: bool = True) -> list[ChainResult]:
    """One forward over every tree row of every job. On the row-invariant kernels
    (``row_forward.enabled``) each row attends its own key list; otherwise attention runs per
    chain (see the module docstring) with at least ``min_rows`` unique rows and chain slots.
    ``logits=False`` (a prefill) skips the LM head."""
    if row_forward.enabled(model):
        return _forward_rows(model, jobs, logits)
    offsets, chains, width, n_rows = _layout(jobs, min_rows)
    slots = [c + [c[-1]] * (width - len(c)) for _, c in chains]  # padding slots repeat the leaf
    first = [0] * n_rows  # dummy rows (beyond every job's rows) read slot 0: unused
    for b in reversed(range(len(chains))):  # the first chain holding a row wins
        for i, u in enumerate(chains[b][1]):
            first[u] = b * width + i
    dev = jobs[0].kv.k.device
    batch = ChainBatch([jobs[j].kv for j, _ in chains], slots, first, dev)
    ids = [t for job in jobs for t in job.ids]
    pos = [p for job in jobs for p in job.positions]
    ids += [ids[-1]] * (n_rows - len(ids))  # dummy rows (min_rows)
    pos += [pos[-1]] * (n_rows - len(pos))
    allowed = torch.zeros((len(chains), width, batch.s), dtype=torch.bool)
    causal = torch.tril(torch.ones((width, width), dtype=torch.bool))
    for b, p in enumerate(batch.past):
        allowed[b, :, :p] = True
        allowed[b, :, p:p + width] = causal  # padding slots come last: no real row sees them
    mask = additive_mask(allowed.to(dev), model.dtype)[0, 0][:, None]  # [C, 1, L, S]
    skip = None if logits else torch.zeros(0, dtype=torch.long, device=dev)
    with torch.inference_mode():
        out = model(torch.as_tensor([ids], device=dev), torch.as_tensor([pos], device=dev), mask, batch, skip,
                    layout=batch)  # [1, U, V]
    return [ChainResult(out[0, offsets[j]:offsets[j + 1]] if logits else None, job.positions, batch,
                        offsets[j], job.chains) for j, job in enumerate(jobs)]


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
