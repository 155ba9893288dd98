"""rapid.modeling.Decoder: parity with transformers, incremental KV decoding, tree masks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen2Config

from rapid.kvcache import StaticKV
from rapid.modeling import Decoder, DecoderConfig, UnsupportedModelError, additive_mask
from rapid.tiny import VOCAB, build_tiny

# float64 models stay float64 end to end, so differently shaped forwards agree to ~1e-14.
TOL = 1e-10


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("modeling_tiny")
    out = {}
    for arch in ("qwen2", "llama"):
        path = build_tiny(root / arch, arch=arch, seed=3)
        out[arch] = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return out


def causal(kv_len: int, t: int) -> torch.Tensor:
    allowed = torch.ones(t, kv_len + t, dtype=torch.bool)
    allowed[:, kv_len:] = torch.tril(torch.ones(t, t, dtype=torch.bool))
    return allowed


def run(model: Decoder, ids, kv: StaticKV, positions=None, allowed=None, rows=None) -> torch.Tensor:
    """One forward of ``ids`` after ``kv.length`` cached entries; returns logits [T or R, V]."""
    t = len(ids)
    if positions is None:
        positions = list(range(kv.length, kv.length + t))
    if allowed is None:
        allowed = causal(kv.length, t)
    kv.begin(t)
    with torch.inference_mode():
        out = model(torch.tensor([ids]), torch.tensor([positions]), additive_mask(allowed, model.dtype), kv,
                    None if rows is None else torch.tensor(rows, dtype=torch.long))
    kv.commit(t)
    return out[0]


def full(model: Decoder, ids) -> torch.Tensor:
    return run(model, ids, StaticKV.for_config(model.config, len(ids) + 1, model.dtype))


def hf_logits(hf, ids) -> torch.Tensor:
    with torch.inference_mode():
        return hf(torch.tensor([ids])).logits[0]


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_full_sequence_parity_with_transformers(tiny_models, arch):
    hf = tiny_models[arch]
    model = Decoder.from_hf(hf)
    assert model.config.model_type == arch and model.config.vocab_size == VOCAB
    ids = np.random.default_rng(1).integers(0, VOCAB, size=23).tolist()
    ours, ref = full(model, ids), hf_logits(hf, ids)
    assert ours.shape == ref.shape == (23, VOCAB)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    # the logits are not degenerate (a broken forward that outputs constants would fail)
    assert ref.std() > 0.1 and len(set(ref.argmax(-1).tolist())) > 1


def test_config_fields_follow_the_checkpoint(tiny_models):
    q = Decoder.from_hf(tiny_models["qwen2"])
    ll = Decoder.from_hf(tiny_models["llama"])
    assert q.config.qkv_bias and not q.config.o_bias and q.config.tie_embeddings
    assert q.lm_head.weight is q.embed_tokens.weight
    assert not ll.config.qkv_bias and not ll.config.tie_embeddings
    assert ll.lm_head.weight is not ll.embed_tokens.weight
    assert q.config.num_kv_heads == 2 and q.config.num_heads == 4 and q.config.head_dim == 16
    assert q.config.eos_token_ids == (256,)
    assert not any(p.requires_grad for p in q.parameters()) and not q.training


@pytest.mark.parametrize("make_cfg", [
    lambda: LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=1, head_dim=16,
                        attention_bias=True, mlp_bias=True, rms_norm_eps=1e-5),
    lambda: Qwen2Config(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                        num_attention_heads=2, num_key_value_heads=2, rope_theta=321.0,
                        tie_word_embeddings=True),
], ids=["llama-bias-headdim-mqa", "qwen2-theta-tied"])
def test_parity_for_config_variants(make_cfg):
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(make_cfg()).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0.0, 0.3)
    ids = list(range(3, 40, 2))
    torch.testing.assert_close(full(Decoder.from_hf(hf), ids), hf_logits(hf, ids), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_incremental_decoding_equals_full_forward(tiny_models, arch):
    model = Decoder.from_hf(tiny_models[arch], dtype=torch.float64)
    assert model.dtype == torch.float64
    rng = np.random.default_rng(2)
    ids = rng.integers(0, VOCAB, size=20).tolist()
    ref = full(model, ids)
    kv = StaticKV.for_config(model.config, 32, model.dtype)
    got, pos = [], 0
    for chunk in (5, 1, 1, 3, 1, 4, 1, 1, 3):
        got.append(run(model, ids[pos:pos + chunk], kv))
        pos += chunk
    assert pos == len(ids) and kv.length == len(ids)
    torch.testing.assert_close(torch.cat(got), ref, atol=TOL, rtol=TOL)


def test_rollback_then_redecode(tiny_models):
    """truncate + feeding different tokens equals a fresh forward of the new sequence."""
    model = Decoder.from_hf(tiny_models["qwen2"], dtype=torch.float64)
    kv = StaticKV.for_config(model.config, 32, model.dtype)
    run(model, [1, 2, 3, 4, 5, 6], kv)
    kv.truncate(3)
    got = run(model, [9, 8], kv)
    torch.testing.assert_close(got, full(model, [1, 2, 3, 9, 8])[3:], atol=TOL, rtol=TOL)


def test_logits_rows_selects_rows(tiny_models):
    model = Decoder.from_hf(tiny_models["llama"])
    ids = [5, 6, 7, 8, 9]
    all_rows = full(model, ids)
    some = run(model, ids, StaticKV.for_config(model.config, 8, model.dtype), rows=[4, 1])
    torch.testing.assert_close(some, all_rows[[4, 1]])
    none = run(model, ids, StaticKV.for_config(model.config, 8, model.dtype), rows=[])
    assert none.shape == (0, VOCAB)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_tree_mask_forward_equals_causal_paths(tiny_models, arch):
    model = Decoder.from_hf(tiny_models[arch], dtype=torch.float64)
    rng = np.random.default_rng(4)
    prefix = rng.integers(0, VOCAB, size=7).tolist()
    n = 12
    parents = [-1] + [int(rng.integers(-1, j)) for j in range(1, n)]
    tokens = rng.integers(0, VOCAB, size=n).tolist()
    depth = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)

    def ancestors(j):
        out = []
        while j >= 0:
            out.append(j)
            j = parents[j]
        return out[::-1]

    kv = StaticKV.for_config(model.config, 32, model.dtype)
    run(model, prefix, kv)
    p = len(prefix)
    allowed = torch.zeros(n, p + n, dtype=torch.bool)
    allowed[:, :p] = True
    for j in range(n):
        for a in ancestors(j):
            allowed[j, p + a] = True
    got = run(model, tokens, kv, positions=[p - 1 + d for d in depth], allowed=allowed)
    assert kv.length == p + n
    for j in range(n):
        seq = prefix + [tokens[a] for a in ancestors(j)]
        torch.testing.assert_close(got[j], full(model, seq)[-1], atol=TOL, rtol=TOL)
    # sanity: the causal (non-tree) mask over the same tokens gives different logits somewhere
    kv2 = StaticKV.for_config(model.config, 32, model.dtype)
    run(model, prefix, kv2)
    flat = run(model, tokens, kv2)
    assert not torch.allclose(flat, got)


def test_float64_model_keeps_float64_precision(tiny_models):
    """Regression: softmax / RoPE once ran in float32 for float64 models (agreement ~1e-7)."""
    model = Decoder.from_hf(tiny_models["llama"], dtype=torch.float64)
    ids = np.random.default_rng(2).integers(0, VOCAB, size=12).tolist()
    ref = full(model, ids)
    kv = StaticKV.for_config(model.config, 16, model.dtype)
    got = torch.cat([run(model, ids[:6], kv)] + [run(model, [t], kv) for t in ids[6:]])
    torch.testing.assert_close(got, ref, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_additive_mask(dtype):
    allowed = torch.tensor([[True, False], [True, True]])
    m = additive_mask(allowed, dtype)
    assert m.shape == (1, 1, 2, 2) and m.dtype == dtype
    assert m[0, 0, 0, 0] == 0 and m[0, 0, 1, 0] == 0 and m[0, 0, 1, 1] == 0
    assert m[0, 0, 0, 1] <= -1e8 and torch.isfinite(m).all()


def test_additive_mask_is_finite_in_float16():
    m = additive_mask(torch.tensor([[True, False]]), torch.float16)
    assert torch.isfinite(m).all() and m[0, 0, 0, 1] < -1e4


def test_gpt2_is_unsupported(tmp_path):
    GPT2Config(n_layer=1, n_head=2, n_embd=16, vocab_size=50).save_pretrained(tmp_path)
    cfg = AutoConfig.from_pretrained(tmp_path)
    assert cfg.model_type == "gpt2"
    with pytest.raises(UnsupportedModelError, match="gpt2"):
        DecoderConfig.from_hf(cfg)
    hf = AutoModelForCausalLM.from_config(cfg)
    with pytest.raises(UnsupportedModelError):
        Decoder.from_hf(hf)


def test_rope_scaling_and_sliding_window_are_unsupported():
    small = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                 num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(UnsupportedModelError, match="rope"):
        DecoderConfig.from_hf(LlamaConfig(**small, rope_scaling={"rope_type": "linear", "factor": 2.0}))
    with pytest.raises(UnsupportedModelError, match="sliding"):
        DecoderConfig.from_hf(Qwen2Config(**small, use_sliding_window=True, sliding_window=8))
    DecoderConfig.from_hf(Qwen2Config(**small))  # the plain one is fine
