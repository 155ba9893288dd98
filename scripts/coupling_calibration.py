"""Measure coupled drafting's proposals and score on the real default pair (docs/bench.md).

For a few prompts per set, the target alone samples ``--tokens`` tokens (temperature / top-p /
seed); the draft then reads prompt + continuation in one causal step, and at every generated
position we compare the target's draw with the draft's candidates:

- plain:   the draft's log-softmax top-k (what an uncoupled drafter proposes)
- coupled: ``rapid.runtime.coupling.coupled_top`` (the target's noise on the draft's logits)

Printed: how often the draw is the rank-1 / rank-2 candidate (hit@1, hit@2), how often it lies
outside the draft's own top-p set, and, for each τ, the coupled score's calibration (mean
predicted exp(score) of rank 1 vs its hit rate) and log-loss of the draw (a draw outside the
candidates costs log of the remaining mass). Deterministic given the seed.

    python scripts/coupling_calibration.py --sets c4,oasst,mtbench,wikitext --n-prompts 2 --tokens 32
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from rapid.bench.prompts import load_sets, pick, truncate_ids
from rapid.geometry import causal_allowed
from rapid.runtime.coupling import coupled_top
from rapid.runtime.generate import open_edge_model
from rapid.sampling import SamplingParams, filtered_logits, log_softmax, top_k_ids
from rapid.server.main import load_target
from rapid.server.target import reference_decode

TAUS = (0.5, 1.0, 2.0, 4.0)


def _draft_rows(engine, ids: list[int]) -> np.ndarray:
    engine.reset()
    h = engine.step(ids, list(range(len(ids))), causal_allowed(0, len(ids)))
    return h.logits()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sets", default="c4,oasst,mtbench,wikitext")
    ap.add_argument("--n-prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--token-budget", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--top-p", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    params = SamplingParams(a.temperature, a.top_p, 0, a.seed)
    edge = open_edge_model("default-draft-int4", "auto", 2048, 1)
    target, _ = load_target("default-target", "auto", 1)
    stats = {"n": 0, "plain1": 0, "plain2": 0, "c1": 0, "c2": 0, "outside": 0}
    pred1 = {t: 0.0 for t in TAUS}
    loss = {t: 0.0 for t in TAUS}
    for set_name, prompts in load_sets(None, a.sets.split(",")).items():
        for p in pick(prompts, a.n_prompts):
            ids = truncate_ids(list(edge.tokenizer(p.text)["input_ids"]), a.token_budget)
            out = reference_decode(target, ids, a.tokens, params)
            rows = _draft_rows(edge.engine, ids + out)
            for j, tok in enumerate(out):
                pos = len(ids) + j
                row = rows[pos - 1]
                stats["n"] += 1
                plain = top_k_ids(log_softmax(row[None])[0], 2).tolist()
                stats["plain1"] += tok == plain[0]
                stats["plain2"] += tok in plain
                stats["outside"] += not np.isfinite(filtered_logits(row, params)[tok])
                for t in TAUS:
                    best = coupled_top(row, pos, params, 2, tau=t)
                    pred1[t] += math.exp(best[0][1])
                    if t == 1.0:
                        stats["c1"] += tok == best[0][0]
                        stats["c2"] += tok in [b[0] for b in best]
                    full = dict(coupled_top(row, pos, params, row.shape[0], tau=t))
                    rest = max(1e-12, 1.0 - sum(math.exp(s) for s in full.values()))
                    loss[t] -= full[tok] if tok in full else math.log(rest)
            print(f"{set_name}/{p.id}: {len(out)} tokens", flush=True)
    n = stats["n"]
    print(f"positions {n}; draw outside the draft's top-p set {stats['outside'] / n:.1%}")
    print(f"plain   hit@1 {stats['plain1'] / n:.1%}  hit@2 {stats['plain2'] / n:.1%}")
    print(f"coupled hit@1 {stats['c1'] / n:.1%}  hit@2 {stats['c2'] / n:.1%}")
    for t in TAUS:
        print(f"tau {t:g}: mean predicted P(rank 1) {pred1[t] / n:.3f}  log-loss/position {loss[t] / n:.3f}")


if __name__ == "__main__":
    main()
