"""Server-side fixtures: the default target's layer shapes with random bf16 weights, and
``make_cloud`` (real verifiers on loopback with given limits)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from rapid.modeling import Decoder, DecoderConfig
from rapid.server.app import VerifierServer
from rapid.server.background import BackgroundServer
from rapid.server.serve_config import Limits

# Qwen2.5-Coder-1.5B's shapes (the default target) with 2 of its 28 layers.
DEFAULT_TARGET_SHAPES = DecoderConfig("qwen2", 151936, 1536, 2, 12, 2, 128, 8960, 1e-6, 1e6, True, False, False,
                                      True, 32768, (151643,))


@pytest.fixture(scope="session")
def real_shapes_bf16():
    torch.manual_seed(0)
    with torch.device("meta"):
        model = Decoder(DEFAULT_TARGET_SHAPES)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.fill_(1.0) if "norm" in name else p.normal_(0.0, 0.02)
    model.lm_head.weight = model.embed_tokens.weight
    return model.eval().requires_grad_(False)


def random_bf16_decoder(cfg: DecoderConfig, seed: int, std: float) -> Decoder:
    """A decoder of ``cfg``'s shapes with N(0, std) weights (norms N(1, std)), tied LM head, bf16."""
    torch.manual_seed(seed)
    with torch.device("meta"):
        model = Decoder(cfg)
    model = model.to_empty(device="cpu").to(torch.bfloat16)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(1.0, std) if "norm" in name else p.normal_(0.0, std)
    model.lm_head.weight = model.embed_tokens.weight
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="session")
def stress_model():
    """The default target's layer shapes (2 of 28 layers) with a 4096-token vocabulary."""
    return random_bf16_decoder(dataclasses.replace(DEFAULT_TARGET_SHAPES, vocab_size=4096, eos_token_ids=(0,)), 1,
                               0.05)


@pytest.fixture()
def make_cloud(tiny_pair):
    """make_cloud(**Limits fields) → a real verifier on loopback (the tiny target), closed after the test."""
    made = []

    def make(**limits):
        server = BackgroundServer(VerifierServer(tiny_pair[0], Limits(**limits)))
        made.append(server)
        return server

    yield make
    for s in made:
        s.close()
