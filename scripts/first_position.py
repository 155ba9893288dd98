"""How well the draft predicts the reply's first token against the tokens after it.

For prompts of the bench sets (the last 64 tokens, raw text, as `rapid bench` sends them) the
target generates greedily; the draft's rank of each target token is read from one draft forward
over prompt + reply. Prints per prompt the ranks, then the top-1 / top-4 agreement at the first
position and at the later ones, and the later agreement split by whether the first was right:
the evidence behind CAAC skipping a request's first verdict (runtime/caac.py).

    .venv/bin/python scripts/first_position.py [--per-set 10] [--offset 1] [--tokens 12]

Default pair from the local cache (`rapid models fetch`); bf16, CPU.
"""

from __future__ import annotations

import argparse

import torch

from rapid.bench.prompts import default_prompt_dir, load_sets, pick, truncate_ids
from rapid.models import load_hf_model, load_tokenizer, resolve_model

SETS = ["c4", "humaneval", "mtbench", "oasst", "wikitext"]


def ranks_of(draft, target, ids: list[int], tokens: int) -> list[int]:
    """The draft's rank (0 = its top choice) of each of the target's next ``tokens`` greedy tokens."""
    with torch.no_grad():
        full = target.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False)[0]
        logits = draft(full[None]).logits[0].float()
    reply = full[len(ids):].tolist()
    return [int((logits[len(ids) - 1 + j] > logits[len(ids) - 1 + j, t]).sum()) for j, t in enumerate(reply)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-set", type=int, default=10)
    ap.add_argument("--offset", type=int, default=1, help="pick offset (the bench uses 0)")
    ap.add_argument("--tokens", type=int, default=12)
    args = ap.parse_args()
    tok = load_tokenizer(resolve_model("default-draft"))
    draft = load_hf_model(resolve_model("default-draft"), torch.bfloat16).eval()
    target = load_hf_model(resolve_model("default-target"), torch.bfloat16).eval()
    first, later, after_hit, after_miss = [], [], [], []
    for name, prompts in load_sets(default_prompt_dir(), SETS).items():
        for p in pick(prompts, args.per_set, args.offset):
            r = ranks_of(draft, target, truncate_ids(list(tok(p.text)["input_ids"]), 64), args.tokens)
            print(name, p.id, r, flush=True)
            first.append(r[0])
            later += r[1:]
            (after_hit if r[0] == 0 else after_miss).append(sum(v == 0 for v in r[1:]) / len(r[1:]))

    def top(xs: list[int], k: int) -> float:
        return sum(v < k for v in xs) / len(xs)

    print(f"{len(first)} prompts: first position top-1 {top(first, 1):.2f} top-4 {top(first, 4):.2f}; "
          f"later top-1 {top(later, 1):.2f} top-4 {top(later, 4):.2f}")
    for label, xs in (("first right", after_hit), ("first wrong", after_miss)):
        if xs:
            print(f"{label}: {len(xs)} prompts, later top-1 {sum(xs) / len(xs):.2f}")


if __name__ == "__main__":
    main()
