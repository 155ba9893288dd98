"""The target forward on CPU with the row-invariant kernels: every row bitwise its one-token step.

A tree forward, a batch of several sessions' trees, a prefill and a target-alone step all run
this one function over U *unique rows* (each job's root and nodes back to back). What a row
computes depends on that row alone, by construction (``server/kernels/rowops_impl.h``):

    x_u   = embed[id_u]                                           gather, exact (bf16 → fp32)
    per layer:
      h   = rms_norm(x_u)                                         fixed-order sum of x_u²
      q, k, v = linear(h)  (+ bias)                               one accumulator per output,
                                                                  k = 0 … K-1 in order
      q, k  = rope(q, k; cos/sin of position_u)                   a table row, unfused mul/add
      k, v  → the KV dtype (round to nearest even: what the session's cache stores)
      a_u = Σ_j softmax_j(q·k_j / √d) v_j  over keys(u)           (see below)
      x_u = x_u + linear_o(a_u)                                   IEEE add per element
      x_u = x_u + down(silu(gate(rms(x_u))) · up(rms(x_u)))
    logits_u = lm_head(rms_norm(x_u))

``keys(u)`` is the session's committed prefix 0 … P-1 followed by the new keys of u's
ancestors and u itself, in depth order (``RowKeys``): exactly the keys, in the same order,
that a one-token step of u's token sees after its ancestors were committed (their committed
keys are the very bits computed here: ``commit`` copies them). No padding row, padding key or
other session's key enters a row's sums, so no key length, chain count, batch composition,
tile or thread count can change them. A tree with holes needs no chain layout here: a row
lists its own ancestors.

Activations are float32 throughout; weights stay in the model dtype (bf16 weights are read as
bf16 and widened exactly, or fed to VDPBF16PS / AMX tiles with the activations rounded to bf16
where the kernels run the ``avx512bf16`` / ``amx`` ISA). This is the target's arithmetic on every path that uses
it — tree verify, ``reference_decode``, prefill — so the target alone and a speculative run
emit the same tokens whatever the machine; two machines (two ISAs) may differ from each other.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from rapid.engines import rowops
from rapid.engines.rowops import PackedWeight, RowKeys
from rapid.modeling import Decoder

ENV_SWITCH = "RAPID_ROW_KERNELS"  # "0": use the torch forward (chains + probe) instead


@dataclass(slots=True)
class LayerWeights:
    ln1: torch.Tensor  # [hidden] float32
    ln2: torch.Tensor  # [hidden] float32
    q: PackedWeight
    k: PackedWeight
    v: PackedWeight
    o: PackedWeight
    gate: PackedWeight
    up: PackedWeight
    down: PackedWeight
    bias: dict[str, torch.Tensor]  # float32 biases by projection name


@dataclass(slots=True)
class RowWeights:
    isa: str  # the kernels' ISA the weights were packed for
    source: tuple  # (dtype, storage addresses) of the weights packed: a model.to(...) repacks
    layers: list[LayerWeights]
    norm: torch.Tensor  # [hidden] float32
    lm_head: PackedWeight


@dataclass(slots=True)
class NewKV:
    """The new keys/values of every layer (``[1, KVH, U, d]`` in the KV dtype), for ``commit``."""

    new_k: list[torch.Tensor]
    new_v: list[torch.Tensor]


def enabled(model: Decoder) -> bool:
    """Whether ``model`` runs on the row-invariant kernels: a CPU model in float32 or bfloat16
    with ``librapid_rowops`` built, unless ``$RAPID_ROW_KERNELS=0``."""
    if getattr(model, "_rapid_rows_only", False):  # its unpacked weights were released
        return True
    if os.environ.get(ENV_SWITCH, "1") == "0":
        return False
    w = model.embed_tokens.weight
    return w.device.type == "cpu" and w.dtype in rowops.WDTYPES and rowops.available()


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float().contiguous()


def _layer_weights(layer) -> LayerWeights:
    a, m = layer.self_attn, layer.mlp
    proj = {"q": a.q_proj, "k": a.k_proj, "v": a.v_proj, "o": a.o_proj, "gate": m.gate_proj, "up": m.up_proj,
            "down": m.down_proj}
    packed = {name: rowops.pack(lin.weight.detach()) for name, lin in proj.items()}
    bias = {name: _f32(lin.bias) for name, lin in proj.items() if lin.bias is not None}
    return LayerWeights(_f32(layer.input_layernorm.weight), _f32(layer.post_attention_layernorm.weight), bias=bias,
                        **packed)


def _source(model: Decoder) -> tuple:
    return (model.dtype, model.embed_tokens.weight.data_ptr(), model.lm_head.weight.data_ptr(),
            model.layers[0].mlp.down_proj.weight.data_ptr())


def row_weights(model: Decoder) -> RowWeights:
    """The packed weights of ``model`` for the current ISA (packed once, kept on the model)."""
    isa = rowops.current_isa()
    cached = getattr(model, "_rapid_row_weights", None)
    if getattr(model, "_rapid_rows_only", False):
        if cached.isa != isa:
            raise rowops.RowOpsArgumentError(f"the target's weights were packed for {cached.isa} and their "
                                             f"unpacked copies released: cannot run {isa}")
        return cached
    source = _source(model)
    if cached is None or cached.isa != isa or cached.source != source:
        with torch.inference_mode():
            cached = RowWeights(isa, source, [_layer_weights(layer) for layer in model.layers],
                                _f32(model.norm.weight), rowops.pack(model.lm_head.weight.detach()))
        model._rapid_row_weights = cached
    return cached


def release_unpacked(model: Decoder) -> int:
    """Pack ``model`` for the row kernels, then drop the unpacked copy of every projection and of
    an untied LM head (the embedding stays: rows gather from it), so a served target holds its
    weights once. The model then runs only on the row kernels. Returns the bytes released."""
    row_weights(model)
    freed = 0
    linears = [m for layer in model.layers for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    if model.lm_head.weight is not model.embed_tokens.weight:
        linears.append(model.lm_head)
    for lin in linears:
        freed += lin.weight.numel() * lin.weight.element_size()
        lin.weight = torch.nn.Parameter(lin.weight.new_empty(0), requires_grad=False)
    model._rapid_rows_only = True
    return freed


def _proj(h: torch.Tensor, lw: LayerWeights, name: str, threads: int) -> torch.Tensor:
    return rowops.linear(h, getattr(lw, name), lw.bias.get(name), threads)


def forward_rows(model: Decoder, ids: Sequence[int], positions: Sequence[int], keys: RowKeys,
                 kv_dtype: torch.dtype, logits_rows: Sequence[int] | None) -> tuple[torch.Tensor | None, NewKV]:
    """Logits ``[R, V]`` float32 of ``logits_rows`` (None: no LM head) and the new KV of all U rows."""
    c = model.config
    w = row_weights(model)
    threads = max(1, torch.get_num_threads())
    u, heads, kvh, d = len(ids), c.num_heads, c.num_kv_heads, c.head_dim
    scale = 1.0 / math.sqrt(d)
    new = NewKV([], [])
    with torch.inference_mode():
        pos = torch.as_tensor([list(positions)], dtype=torch.long)
        cos, sin = (t[0, 0].contiguous() for t in model.rope(pos, torch.float32))  # [U, d] table rows
        x = model.embed_tokens.weight[torch.as_tensor(list(ids), dtype=torch.long)].float()  # [U, hidden]
        for i, lw in enumerate(w.layers):
            h = rowops.rms_norm(x, lw.ln1, c.rms_eps)
            q = _proj(h, lw, "q", threads).view(u, heads, d)
            k = _proj(h, lw, "k", threads).view(u, kvh, d)
            v = _proj(h, lw, "v", threads).view(u, kvh, d)
            rowops.rope(q, cos, sin)
            rowops.rope(k, cos, sin)
            k_s = k.to(kv_dtype).transpose(0, 1).contiguous()  # [KVH, U, d]
            v_s = v.to(kv_dtype).transpose(0, 1).contiguous()
            new.new_k.append(k_s[None])
            new.new_v.append(v_s[None])
            a = rowops.attention(q, k_s, v_s, keys, i, scale)  # [U, H, d]
            x = x + _proj(a.view(u, heads * d), lw, "o", threads)
            h = rowops.rms_norm(x, lw.ln2, c.rms_eps)
            act = rowops.silu_mul(_proj(h, lw, "gate", threads), _proj(h, lw, "up", threads))
            x = x + _proj(act, lw, "down", threads)
        if logits_rows is None:
            return None, new
        rows = x[torch.as_tensor(list(logits_rows), dtype=torch.long)].contiguous()
        return rowops.linear(rowops.rms_norm(rows, w.norm, c.rms_eps), w.lm_head, None, threads), new
