"""The target forward where the row kernels do not run (a CUDA target, float64, a CPU without
``librapid_rowops``): library kernels, called only at shapes that never change.

cuBLAS, oneDNN and MKL pick a kernel — and with it the order of every sum — by the shape of
the call: the number of rows M, the key length. So a tree row computed among 17 rows, or with 70
keys of which 6 are masked zeros, may round differently from the same row in a one-token step.
Here no call's shape depends on the tree, the batch or the prompt:

    every per-row op          embedding, RMSNorm, q/k/v/o, RoPE, SiLU·up, gate/up/down, the
                              residual adds, the LM head: on blocks of exactly R rows, zeros past
                              the last row
    attention                 a row's keys are its session prefix 0 … P−1, then its ancestors'
                              new keys and its own in depth order — exactly the keys, in the
                              order, a one-token step sees after those ancestors were committed.
                              Consecutive rows of one chain share a key list (each sees a prefix
                              of it) in a *segment* of L rows; a segment spans S = key_slots(n) =
                              ⌈n / 256⌉·256 key slots (zero keys past its rows', masked to −inf:
                              an exact 0 in the softmax and in probs @ V), and every row of it has
                              a key count n with that same S. B segments of one S per call:
                              [B, KVH, L·G, d] @ [B, KVH, d, S], then softmax and @ [B, KVH, S, d]

(``block_shape``: R, L, B = 64, 8, 8 on CUDA, 8, 8, 4 elsewhere.) A one-token step is one
segment of one row, padded. A row's inputs to every call are therefore bitwise those of its
one-token step, in a call of the same shape; what can still differ is the row's *position*
inside its block (and which block). Position is a finite thing:
``rapid.server.invariance.position_probe`` fills every position of the per-row blocks and of
the attention call, for every S up to the context, and ``rapid serve`` verifies trees only when
every position gives the one-token step's bits (sequentially otherwise: exact by construction,
no tree speed-up). Kernels do not branch on the values they reduce, so a shape × position that
passed is the same arithmetic for any values. Intra-op threads are fixed per process: the target
alone and a speculative run in one process use the same ones. The row kernels (``row_forward``)
need none of this: there a row's arithmetic does not depend on its position either.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rapid.kvcache import StaticKV
from rapid.modeling import Decoder, Layer, rotate_half
from rapid.server.row_forward import NewKV


@dataclass(slots=True, frozen=True)
class BlockShape:
    rows: int  # R: rows of every per-row call
    segment: int  # L: rows of one attention segment (consecutive rows of one chain)
    segments: int  # B: segments of one attention call


BLOCK_SHAPES = {"cuda": BlockShape(64, 8, 8)}  # a 64-row GEMM streams the weights once, like one row
OTHER_SHAPE = BlockShape(8, 8, 4)  # a CPU without the row kernels (float64, tests)
KEY_BLOCK = 256  # attention key slots come in multiples of this


def block_shape(device: torch.device) -> BlockShape:
    """The call shapes on ``device`` (one per process and device type)."""
    return BLOCK_SHAPES.get(device.type, OTHER_SHAPE)


def key_slots(n: int) -> int:
    """Key slots of a row with ``n`` keys: ⌈n / KEY_BLOCK⌉ · KEY_BLOCK."""
    return KEY_BLOCK * -(-n // KEY_BLOCK)


@dataclass(slots=True)
class RowChain:
    """Unique rows of one root-to-leaf chain, root first, and the session KV they extend."""

    kv: StaticKV  # the session's committed KV (its prefix: entries 0 … kv.length − 1)
    rows: list[int]


@dataclass(slots=True)
class AttentionBlock:
    rows: torch.Tensor  # [B, L] unique row per position; U (the zero row) for padding
    keys: torch.Tensor  # [B, S] pool index per key slot: the segment's last row's key list
    allowed: torch.Tensor  # [B, 1, L·G, S] bool: slot < the key count of the position's row


@dataclass(slots=True)
class BlockPlan:
    """Where every row's keys come from, the same for every layer of one forward."""

    rows: int  # U
    prefixes: list[StaticKV]  # distinct sessions, in pool order
    blocks: list[AttentionBlock]


def _segments(chains: Sequence[RowChain], base: dict[int, int], new: int, seg: int) -> list[tuple[list[int], list[int]]]:
    """(rows, key list of the last row) per segment: each chain's rows not on an earlier chain
    (a suffix), cut where the key slots change and every ``seg`` rows."""
    done: set[int] = set()
    out = []
    for ch in chains:
        prefix = list(range(base[id(ch.kv)], base[id(ch.kv)] + ch.kv.length))
        run: list[int] = []
        for i, row in enumerate(ch.rows):
            if row in done:
                continue
            done.add(row)
            n = len(prefix) + i + 1
            if run and (len(run) == seg or key_slots(n) != key_slots(n - 1)):
                out.append((run, prefix + [new + r for r in ch.rows[:i]]))
                run = []
            run.append(row)
        if run:
            out.append((run, prefix + [new + r for r in ch.rows]))
    return out


def plan(chains: Sequence[RowChain], u: int, shape: BlockShape, group: int, device: torch.device) -> BlockPlan:
    """Each layer's key pool is ``[prefix_0 ‖ prefix_1 ‖ … ‖ new rows (U) ‖ one zero key]``
    along the key axis; a segment's key list indexes into it, its rows see a prefix of it."""
    prefixes: list[StaticKV] = []
    base: dict[int, int] = {}
    new = 0  # pool index of the first new row: the prefixes' total length
    for ch in chains:
        if id(ch.kv) not in base:
            base[id(ch.kv)] = new
            prefixes.append(ch.kv)
            new += ch.kv.length
    zero = new + u
    by_slots: dict[int, list[tuple[list[int], list[int]]]] = {}
    for rows, keys in _segments(chains, base, new, shape.segment):
        by_slots.setdefault(key_slots(len(keys)), []).append((rows, keys))
    blocks = []
    b, L = shape.segments, shape.segment
    for slots, segs in sorted(by_slots.items()):
        for i in range(0, len(segs), b):
            ids = torch.full((b, L), u, dtype=torch.long)
            idx = torch.full((b, slots), zero, dtype=torch.long)
            count = torch.ones((b, L), dtype=torch.long)  # padding positions attend the zero key
            for j, (rows, keys) in enumerate(segs[i:i + b]):
                ids[j, :len(rows)] = torch.as_tensor(rows)
                idx[j, :len(keys)] = torch.as_tensor(keys)
                count[j, :len(rows)] = torch.arange(len(keys) - len(rows) + 1, len(keys) + 1)
            allowed = torch.arange(slots)[None, None] < count.repeat_interleave(group, dim=1)[:, :, None]
            blocks.append(AttentionBlock(ids.to(device), idx.to(device), allowed[:, None].to(device)))
    return BlockPlan(u, prefixes, blocks)


def _qkv(layer: Layer, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """One block: q ``[R, H, d]``, k, v ``[R, KVH, d]`` (RoPE applied)."""
    a, r = layer.self_attn, x.shape[0]
    h = layer.input_layernorm(x)
    q = a.q_proj(h).view(r, a.c.num_heads, a.c.head_dim)
    k = a.k_proj(h).view(r, a.c.num_kv_heads, a.c.head_dim)
    v = a.v_proj(h).view(r, a.c.num_kv_heads, a.c.head_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin, v


def _attention(model: Decoder, p: BlockPlan, layer: int, q: torch.Tensor, k: torch.Tensor,
               v: torch.Tensor) -> torch.Tensor:
    """``[U, H, d]`` outputs; q ``[U, H, d]``, k/v ``[U, KVH, d]`` (the forward's new rows)."""
    c = model.config
    u, kvh, d = p.rows, c.num_kv_heads, c.head_dim
    zero = k.new_zeros((kvh, 1, d))
    pool_k = torch.cat([kv.k[layer, :, :kv.length] for kv in p.prefixes] + [k.transpose(0, 1), zero], dim=1)
    pool_v = torch.cat([kv.v[layer, :, :kv.length] for kv in p.prefixes] + [v.transpose(0, 1), zero], dim=1)
    q_pad = torch.cat([q, q.new_zeros((1, *q.shape[1:]))])
    out = q.new_empty(q.shape)
    scale = 1.0 / math.sqrt(d)
    for blk in p.blocks:
        b, L = blk.rows.shape
        kb = pool_k[:, blk.keys].transpose(0, 1).contiguous()  # [B, KVH, S, d]
        vb = pool_v[:, blk.keys].transpose(0, 1).contiguous()
        qb = q_pad[blk.rows].view(b, L, kvh, -1, d).permute(0, 2, 1, 3, 4).reshape(b, kvh, -1, d)  # [B, KVH, L·G, d]
        scores = torch.matmul(qb, kb.transpose(2, 3)) * scale  # [B, KVH, L·G, S]
        upcast = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
        probs = torch.softmax(upcast.masked_fill(~blk.allowed, float("-inf")), dim=-1).to(q.dtype)
        ob = torch.matmul(probs, vb).view(b, kvh, L, -1, d).permute(0, 2, 1, 3, 4).reshape(b * L, c.num_heads, d)
        rows = blk.rows.flatten()
        real = rows < u
        out[rows[real]] = ob[real]
    return out


def forward_blocks(model: Decoder, ids: Sequence[int], positions: Sequence[int], chains: Sequence[RowChain],
                   logits_rows: Sequence[int] | None) -> tuple[torch.Tensor | None, NewKV]:
    """Logits ``[len(logits_rows), V]`` (model dtype; None: no LM head) and the new KV of all U rows."""
    dev = model.embed_tokens.weight.device
    shape, u = block_shape(dev), len(ids)
    r = shape.rows
    n = r * -(-u // r)
    p = plan(chains, u, shape, model.config.num_heads // model.config.num_kv_heads, dev)
    new = NewKV([], [])
    with torch.inference_mode():
        pos = torch.as_tensor([list(positions) + [0] * (n - u)], dtype=torch.long, device=dev)
        cos, sin = (t[0, 0][:, None] for t in model.rope(pos, model.dtype))  # [n, 1, d]
        x = model.embed_tokens(torch.as_tensor(list(ids) + [0] * (n - u), dtype=torch.long, device=dev))
        x[u:] = 0
        blocks = range(0, n, r)
        for i, layer in enumerate(model.layers):
            qkv = [_qkv(layer, x[b:b + r], cos[b:b + r], sin[b:b + r]) for b in blocks]
            q, k, v = (torch.cat(t)[:u] for t in zip(*qkv, strict=True))
            new.new_k.append(k.transpose(0, 1)[None].contiguous())
            new.new_v.append(v.transpose(0, 1)[None].contiguous())
            a = torch.cat([_attention(model, p, i, q, k, v), q.new_zeros((n - u, *q.shape[1:]))])
            a = a.view(n, -1)
            for b in blocks:
                h = x[b:b + r] + layer.self_attn.o_proj(a[b:b + r])
                x[b:b + r] = h + layer.mlp(layer.post_attention_layernorm(h))
        if logits_rows is None:
            return None, new
        sel = list(logits_rows)
        m = r * -(-len(sel) // r)
        rows = torch.cat([x[torch.as_tensor(sel, dtype=torch.long, device=dev)], x.new_zeros((m - len(sel), x.shape[1]))])
        out = torch.cat([model.lm_head(model.norm(rows[b:b + r])) for b in range(0, m, r)])
        return out[:len(sel)], new
