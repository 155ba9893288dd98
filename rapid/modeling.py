"""A compact Llama-family decoder (Llama, Qwen2) with explicit KV and an explicit attention mask.

Both the edge draft (PyTorch backend, ONNX export) and the cloud target run this one forward, so
a tree step is *the same arithmetic* everywhere. Weights come straight from a Hugging Face
checkpoint (``from_hf``), and ``tests/test_modeling.py`` checks logits against transformers.

One layer, for T new tokens at positions ``p`` attending to S = P + T keys:

    h   = x + o_proj(softmax(q kᵀ / √d + M) v)      q, k = rope(W_q x + b_q, p), rope(W_k x + b_k, p)
    out = h + down(silu(gate(rms(h))) * up(rms(h)))

``M`` is the additive mask ``[1, 1, T, S]``: 0 where a token may attend, a large negative
number elsewhere. A token tree is just a mask in which a node sees the prefix, its ancestors
and itself; its position is prefix length + depth.

KV handling is delegated to a ``KVStore`` (see ``rapid.kvcache``): each layer hands it the new
keys/values ``[1, kv_heads, T, head_dim]`` and gets back the full ``[1, kv_heads, S, head_dim]``.
A static cache writes into a preallocated buffer (no copy, gpt-fast style); the ONNX export
wrapper concatenates explicit ``past_*`` inputs instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from rapid.core.errors import RapidError
from rapid.models import load_hf_model, load_tokenizer

SUPPORTED_ARCHITECTURES = ("qwen2", "llama")
MASK_MIN = -1e9  # additive "blocked" value; finite so an fp16 export stays NaN-free


class UnsupportedModelError(RapidError):
    """The checkpoint is not a decoder this module implements."""


@dataclass(slots=True, frozen=True)
class DecoderConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rms_eps: float
    rope_theta: float
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tie_embeddings: bool
    max_position: int
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_hf(cls, cfg: Any) -> DecoderConfig:
        """Read a transformers ``PretrainedConfig``; raise for anything we would get wrong."""
        mtype = getattr(cfg, "model_type", "?")
        if mtype not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"model_type {mtype!r} is not supported (supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
            )
        rope = getattr(cfg, "rope_parameters", None) or {}
        rope_type = rope.get("rope_type", "default") if isinstance(rope, dict) else "default"
        scaling = getattr(cfg, "rope_scaling", None)
        if rope_type != "default" or (isinstance(scaling, dict) and scaling.get("rope_type", scaling.get("type")) not in (None, "default")):
            raise UnsupportedModelError(f"rope type {rope_type!r} / scaling {scaling!r} is not supported")
        theta = rope.get("rope_theta") if isinstance(rope, dict) else None
        theta = float(theta if theta is not None else getattr(cfg, "rope_theta", 10000.0))
        if getattr(cfg, "use_sliding_window", False):
            raise UnsupportedModelError("sliding-window attention is not supported")
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        eos = cfg.eos_token_id
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
        return cls(
            model_type=mtype,
            vocab_size=cfg.vocab_size,
            hidden_size=cfg.hidden_size,
            num_layers=cfg.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(cfg, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            intermediate_size=cfg.intermediate_size,
            rms_eps=float(cfg.rms_norm_eps),
            rope_theta=theta,
            qkv_bias=mtype == "qwen2" or bool(getattr(cfg, "attention_bias", False)),
            o_bias=mtype != "qwen2" and bool(getattr(cfg, "attention_bias", False)),
            mlp_bias=bool(getattr(cfg, "mlp_bias", False)),
            tie_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
            max_position=int(getattr(cfg, "max_position_embeddings", 32768)),
            eos_token_ids=eos_ids,
        )


class KVStore(Protocol):
    """Where a layer's keys/values live during one forward."""

    def attend_kv(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Take ``[1, kvh, T, d]`` new entries, return ``[1, kvh, P+T, d]`` keys and values."""
        ...


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float() if dtype in (torch.float16, torch.bfloat16) else x
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[B, 1, T, d]`` for positions ``[B, T]`` (HF "rotate_half" convention)."""
    # float32 like transformers; float64 models get float64 angles so a tree step and a plain
    # step agree to ~1e-16 (vectorised float32 cos differs by an ulp with the batch layout).
    ft = torch.float64 if dtype == torch.float64 else torch.float32
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=ft, device=position_ids.device) / head_dim))
    if position_ids.shape[0] == 1:  # the B = 1 path, kept exactly as it always was
        freqs = position_ids[0].to(ft)[:, None] * inv_freq[None, :]  # [T, d/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[None, None], emb.sin().to(dtype)[None, None]
    freqs = position_ids.to(ft)[:, :, None] * inv_freq[None, None, :]  # [B, T, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype)[:, None], emb.sin().to(dtype)[:, None]


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class Attention(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias)

    def forward(self, x, cos, sin, mask, kv: KVStore, layer: int) -> torch.Tensor:
        c, B, T = self.c, x.shape[0], x.shape[1]
        q = self.q_proj(x).view(B, T, c.num_heads, c.head_dim).transpose(1, 2)  # [B, H, T, d]
        k = self.k_proj(x).view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)  # [B, KVH, T, d]
        v = self.v_proj(x).view(B, T, c.num_kv_heads, c.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k_all, v_all = kv.attend_kv(layer, k, v)  # [B, KVH, S, d]
        group = c.num_heads // c.num_kv_heads
        if group > 1:
            k_all = k_all.repeat_interleave(group, dim=1)
            v_all = v_all.repeat_interleave(group, dim=1)
        scores = torch.matmul(q, k_all.transpose(2, 3)) * (1.0 / math.sqrt(c.head_dim)) + mask
        upcast = scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores
        probs = torch.softmax(upcast, dim=-1).to(q.dtype)
        out = torch.matmul(probs, v_all)
        out = out.transpose(1, 2).reshape(B, T, c.num_heads * c.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_eps)
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_eps)
        self.mlp = MLP(c)

    def forward(self, x, cos, sin, mask, kv: KVStore, layer: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, kv, layer)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """Causal LM forward over explicit positions, mask and KV store."""

    def __init__(self, c: DecoderConfig) -> None:
        super().__init__()
        self.config = c
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.layers = nn.ModuleList(Layer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_eps)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        if c.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self._rope_table: tuple[torch.Tensor, torch.Tensor] | None = None  # see ``rope``

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    def rope(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin ``[B, 1, T, d]``, looked up in a table computed once for positions 0..n-1.

        A row's angles then never depend on how many rows, sessions or positions share the
        forward (vectorised ``cos`` rounds its scalar tail differently), which batch-invariant
        verification needs. Traced exports compute them inline instead (no table constant).
        """
        c = self.config
        if torch.compiler.is_exporting() or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
            return rope_cos_sin(position_ids, c.head_dim, c.rope_theta, dtype)
        need = int(position_ids.max()) + 1 if position_ids.numel() else 1
        table = self._rope_table
        if table is None or table[0].shape[0] < need or table[0].dtype != dtype or table[0].device != position_ids.device:
            n = max(1024, 1 << (need - 1).bit_length())
            pos = torch.arange(n, device=position_ids.device)[None]
            cos, sin = rope_cos_sin(pos, c.head_dim, c.rope_theta, dtype)
            table = self._rope_table = (cos[0, 0], sin[0, 0])  # [n, d] each
        return table[0][position_ids][:, None], table[1][position_ids][:, None]

    def forward(
        self,
        input_ids: torch.Tensor,  # [B, T] int64 (B > 1: a batch of sessions, see rapid.server.batching)
        position_ids: torch.Tensor,  # [B, T] int64
        attn_mask: torch.Tensor,  # [B, 1, T, P+T] additive, model dtype
        kv: KVStore,
        logits_rows: torch.Tensor | None = None,  # [R] rows of T to project; None = all
    ) -> torch.Tensor:  # [B, T or R, V]
        x = self.embed_tokens(input_ids)
        cos, sin = self.rope(position_ids, x.dtype)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, attn_mask, kv, i)
        if logits_rows is not None:
            x = x[:, logits_rows]
        return self.lm_head(self.norm(x))

    @classmethod
    def from_hf(cls, hf_model: Any, dtype: torch.dtype | None = None) -> Decoder:
        """Build from a loaded transformers causal LM (weights are shared, not copied, when dtypes match)."""
        c = DecoderConfig.from_hf(hf_model.config)
        state = hf_model.state_dict()
        with torch.device("meta"):
            model = cls(c)
        own = {}
        for name in model.state_dict():
            src = "lm_head.weight" if name == "lm_head.weight" else f"model.{name}"
            if src not in state and name == "lm_head.weight":
                src = "model.embed_tokens.weight"
            if src not in state:
                raise UnsupportedModelError(f"checkpoint has no tensor {src!r}")
            own[name] = state[src]
        model.load_state_dict(own, assign=True, strict=True)
        if c.tie_embeddings:
            model.lm_head.weight = model.embed_tokens.weight
        if dtype is not None:
            model = model.to(dtype)
        return model.eval().requires_grad_(False)


def load_decoder(spec: str, dtype: torch.dtype = torch.float32) -> tuple[Decoder, Any]:
    """Load (decoder, tokenizer) from an HF id, local folder, GGUF path or default alias."""
    hf = load_hf_model(spec, dtype=dtype)
    return Decoder.from_hf(hf, dtype=dtype), load_tokenizer(spec)


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool ``[T, S]`` (True = may attend) → additive ``[1, 1, T, S]`` in ``dtype``."""
    zero = torch.zeros((), dtype=dtype)
    blocked = torch.full((), max(MASK_MIN, torch.finfo(dtype).min / 2), dtype=dtype)  # finite in fp16 too
    return torch.where(allowed, zero, blocked)[None, None]
