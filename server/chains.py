"""Tree verification as root-to-leaf chains: every row bitwise a one-token step.

A tree forward with an ancestor mask leaves *holes* in a row's keys: node 5 of
``parents = [-1, 0, 0, 1, 2, 3]`` sees the prefix, the root and nodes 0, 1, 3 but not 2 and 4,
which sit between them. The one-token step of the same prefix sees those keys contiguously.
A masked key contributes an exact zero, but *where* the non-zeros sit changes how the softmax
sum and the ``probs @ V`` reduction group them (vector lanes, K-blocks), so the row rounds
differently: measured on the bf16 1.5B target, 2 of 7 rows of that tree differed by up to 0.19
in the logits and a HumanEval output changed at token 46.

So each root-to-leaf path is verified as its own *chain*, one batch row of a batched forward:

    batch row b = chain b = [root, a_1, …, leaf_b]        keys: session prefix ‖ chain rows
    row i of chain b sees  prefix ‖ root, a_1 … a_i       (causal: only trailing masked keys)

exactly the layout of a one-token step after ``root, a_1 … a_{i-1}`` were committed, so every
row is the step's row (given M-invariant GEMMs, which ``rapid.server.invariance`` measures).
A node on several paths is computed once per chain, identically; its logits are read from the
first. Several sessions batch the same way (their chains are more batch rows). Nothing is
written into a session's KV during the forward: ``commit`` copies the accepted chain's new
keys/values (root + path) afterwards, so a failed forward changes nothing.

Every forward attends at least ``MIN_KEYS`` keys (masked zeros past a row's own). ATen picks the
kernel of a bf16 ``bmm`` by size: a naive loop below ``k·m·n`` = 400, oneDNN above ``b·m·k·n`` =
4096 (b = rows × heads), per-matrix BLAS between. The paths round differently on rare values
(measured: a tiny model's PV product hit an fp32 tie that oneDNN rounded down and BLAS up), so a
session's rows changed when another session joined its batch and pushed b over 4096. With
m ≥ 2 (``min_rows``) and S ≥ ``MIN_KEYS`` = 64, ``b·m·k·n`` ≥ 2·64·heads·head_dim > 4096 for any
model with heads·head_dim ≥ 64: one path, whatever the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rapid.kvcache import StaticKV
from rapid.modeling import Decoder, additive_mask

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


class ChainKV:
    """``KVStore`` for a chain batch: row b attends ``prefix_b ‖ its own new entries``; the new
    entries of every layer are kept (``new_k[layer]`` ``[R, KVH, L, d]``) for ``commit``."""

    def __init__(self, prefixes: Sequence[StaticKV], width: int) -> None:
        self.prefixes = list(prefixes)  # [R] the session KV each batch row extends
        self.past = [kv.length for kv in self.prefixes]
        self.s = max(MIN_KEYS, max(self.past) + width)
        self.new_k: list[torch.Tensor] = []
        self.new_v: list[torch.Tensor] = []

    def attend_kv(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor):
        r, h, t, d = k_new.shape
        self.new_k.append(k_new)
        self.new_v.append(v_new)
        k_out = k_new.new_zeros((r, h, self.s, d))
        v_out = v_new.new_zeros((r, h, self.s, d))
        for b, kv in enumerate(self.prefixes):
            p = self.past[b]
            k_out[b, :, :p] = kv.k[layer, :, :p]
            v_out[b, :, :p] = kv.v[layer, :, :p]
            k_out[b, :, p:p + t] = k_new[b]
            v_out[b, :, p:p + t] = v_new[b]
        return k_out, v_out


@dataclass(slots=True)
class ChainResult:
    logits: torch.Tensor | None  # [1+N, V] tree rows, model dtype (None: not projected)
    positions: list[int]  # [1+N]
    kv: ChainKV  # the batch's new entries
    chain_rows: list[int]  # [C] batch row of each of this job's chains
    chains: list[list[int]]


def forward_chains(model: Decoder, jobs: Sequence[ChainJob], min_rows: int,
                   logits: bool = True) -> list[ChainResult]:
    """One batched forward over every chain of every job (see the module docstring); every
    forward computes at least ``min_rows`` rows per chain. ``logits=False`` (a prefill) skips
    the LM head."""
    rows = [(j, c) for j, job in enumerate(jobs) for c in range(len(job.chains))]
    width = max(max(len(jobs[j].chains[c]) for j, c in rows), min_rows)
    kv = ChainKV([jobs[j].kv for j, _ in rows], width)
    dev = jobs[0].kv.k.device
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    pos = torch.zeros((len(rows), width), dtype=torch.long)
    allowed = torch.zeros((len(rows), width, kv.s), dtype=torch.bool)
    causal = torch.tril(torch.ones((width, width), dtype=torch.bool))
    for b, (j, c) in enumerate(rows):
        chain, p = jobs[j].chains[c], kv.past[b]
        ids[b, : len(chain)] = torch.as_tensor([jobs[j].ids[r] for r in chain])
        pos[b, : len(chain)] = torch.as_tensor([jobs[j].positions[r] for r in chain])
        pos[b, len(chain):] = pos[b, len(chain) - 1]  # padding rows: their output is unused
        allowed[b, :, :p] = True
        allowed[b, :, p:p + width] = causal  # padding rows come last: no real row sees them
    mask = additive_mask(allowed.to(dev), model.dtype)[0, 0][:, None]  # [R, 1, L, S]
    skip = None if logits else torch.zeros(0, dtype=torch.long, device=dev)
    with torch.inference_mode():
        out_logits = model(ids.to(dev), pos.to(dev), mask, kv, skip)  # [R, L, V]
    out, first = [], 0
    for job in jobs:
        where = {}
        for c, chain in enumerate(job.chains):
            for i, r in enumerate(chain):
                where.setdefault(r, (first + c, i))
        order = [where[r] for r in range(len(job.ids))]
        rows_logits = out_logits[[b for b, _ in order], [i for _, i in order]] if logits else None
        out.append(ChainResult(rows_logits, job.positions, kv, list(range(first, first + len(job.chains))),
                               job.chains))
        first += len(job.chains)
    return out


def commit(result: ChainResult, target: StaticKV, path_rows: Sequence[int]) -> None:
    """Append the KV of tree rows ``path_rows`` (root first, then the accepted path: a prefix of
    some chain) from ``result`` to ``target``."""
    n = len(path_rows)
    c = next(i for i, ch in enumerate(result.chains) if ch[:n] == list(path_rows))
    b, p = result.chain_rows[c], target.length
    if p + n > target.capacity:
        raise ValueError(f"commit: {n} entries from {p} exceed capacity {target.capacity}")
    for layer, (k, v) in enumerate(zip(result.kv.new_k, result.kv.new_v, strict=True)):
        target.k[layer, :, p:p + n] = k[b, :, :n]
        target.v[layer, :, p:p + n] = v[b, :, :n]
    target.length = p + n
