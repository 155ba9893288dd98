"""The peers a Python user would pick instead, run on the bench's prompts, machine and pair.

HF transformers, the same target and its PyTorch draft in the same dtype, greedy, one thread,
pinned to the core the cloud used (after the cloud has stopped):

    hf-plain      ``target.generate(ids)``                              the peers' own baseline
    hf-assisted   ``target.generate(ids, assistant_model=draft)``       assisted generation
    hf-lookup     ``target.generate(ids, prompt_lookup_num_tokens=10)`` prompt-lookup decoding

Each peer's ratio is to ``hf-plain`` on the same prompt (its own target-alone), as rapid's is to
``ar``; ``identical`` says whether its tokens equal hf-plain's. One row per generation goes to
``peers.jsonl`` (set, prompt_id, repeat, method, tokens, seconds, digest).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

PEERS = ("hf-plain", "hf-assisted", "hf-lookup")
LOOKUP_TOKENS = 10  # HF's documented example value for prompt_lookup_num_tokens


@dataclass(slots=True)
class PeerRun:
    set: str
    prompt_id: str
    repeat: int
    method: str  # one of PEERS
    tokens: list[int]  # new tokens
    seconds: float
    digest: str


def _load(path: str, dtype: torch.dtype):
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()


def _methods(draft) -> dict[str, dict]:
    return {"hf-plain": {}, "hf-assisted": {"assistant_model": draft},
            "hf-lookup": {"prompt_lookup_num_tokens": LOOKUP_TOKENS}}


def _generate(target, ids: list[int], max_new: int, extra: dict) -> tuple[list[int], float]:
    x = torch.tensor([ids])
    t0 = time.perf_counter()
    with torch.inference_mode():
        y = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new, do_sample=False,
                            **extra)
    return y[0, len(ids):].tolist(), time.perf_counter() - t0


def run_peers(target_path: str, draft_path: str, dtype: str, encoded: dict[str, list[tuple[str, list[int]]]],
              max_new: int, repeats: int, out: Path, on_gen: Callable[[str], None] | None = None) -> None:
    """Append one ``PeerRun`` per generation to ``out / 'peers.jsonl'`` (module docstring)."""
    torch.set_num_threads(1)
    tdtype = getattr(torch, dtype)
    target, draft = _load(target_path, tdtype), _load(draft_path, tdtype)
    methods = _methods(draft)
    first = next(iter(encoded.values()))[0][1]
    for extra in methods.values():  # warm-up: first forwards, lazy init
        _generate(target, first, 4, extra)
    with open(out / "peers.jsonl", "a", encoding="utf-8") as f:
        for rep in range(repeats):
            for set_name, items in encoded.items():
                for prompt_id, ids in items:
                    names = list(methods) if rep % 2 == 0 else list(methods)[::-1]
                    for name in names:
                        toks, secs = _generate(target, ids, max_new, methods[name])
                        digest = hashlib.sha1(json.dumps(toks).encode()).hexdigest()[:12]
                        f.write(json.dumps(asdict(PeerRun(set_name, prompt_id, rep, name, toks, secs, digest))) + "\n")
                        if on_gen:
                            on_gen(f"{name} {set_name} r{rep}")
