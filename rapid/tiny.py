"""Tiny random-weight Qwen2 / Llama checkpoints with a byte-level tokenizer, built offline.

Tests, ``rapid bench --smoke`` and ``rapid demo --tiny`` use them so nothing needs a download.
A folder written here is an ordinary HF checkpoint (config.json, safetensors, tokenizer), so
every loader treats it exactly like a real model.

Pairs for tests: draft = target (100 % acceptance), another seed (~0 %), or a perturbed copy
of the target (``perturb`` > 0: partial acceptance).
"""

from __future__ import annotations

import json
from pathlib import Path

VOCAB = 259  # 256 bytes + <|endoftext|> + <|im_start|> + <|im_end|>
EOS_ID = 256

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_tokenizer(folder: Path) -> None:
    """A byte-level BPE tokenizer with no merges: every byte is one token."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    byte_chars = pre_tokenizers.ByteLevel.alphabet()
    alphabet = sorted(byte_chars, key=lambda ch: _byte_of(ch))
    vocab = {ch: i for i, ch in enumerate(alphabet)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<|im_end|>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(folder)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte → printable character map (what a ByteLevel tokenizer stores in its vocab)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def _byte_of(ch: str) -> int:
    """Inverse of the GPT-2 bytes→unicode map."""
    return {c: b for b, c in bytes_to_unicode().items()}[ch]


def build_tiny(folder: str | Path, arch: str = "qwen2", seed: int = 0, perturb: float = 0.0,
               base_seed: int | None = None, hidden: int = 64, layers: int = 2, heads: int = 4,
               kv_heads: int = 2, dtype: str = "float32") -> Path:
    """Write a tiny random causal LM to ``folder`` and return it.

    ``perturb`` > 0 builds the weights of ``base_seed`` (default ``seed``) plus Gaussian noise of
    that relative size drawn with ``seed``: a draft that agrees with that target part of the time.
    """
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    common = dict(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
                  eos_token_id=EOS_ID, bos_token_id=None, pad_token_id=EOS_ID, tie_word_embeddings=arch == "qwen2",
                  rms_norm_eps=1e-6)
    cfg = Qwen2Config(**common) if arch == "qwen2" else LlamaConfig(**common)
    torch.manual_seed(base_seed if base_seed is not None else seed)
    model = AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():  # larger weights → peakier, more decisive logits
            if "norm" in name:
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, 0.25 if p.ndim > 1 else 0.1)
        if perturb > 0:
            g = torch.Generator().manual_seed(seed)
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * perturb * p.std())
    model = model.to(getattr(torch, dtype))
    model.save_pretrained(folder, safe_serialization=True)
    write_tokenizer(folder)
    (folder / "rapid-source.json").write_text(json.dumps({"tiny": True, "arch": arch, "seed": seed, "perturb": perturb}))
    return folder
