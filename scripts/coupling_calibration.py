"""Measure coupled drafting's ranking and score on the real default pair (rapid.runtime.coupling).

For a few prompts per set, the target alone samples ``--tokens`` tokens (temperature / top-p /
seed); the draft then reads prompt + continuation in one causal step, and at every generated
position the target's draw is compared with the draft's ranked candidates:

- plain:    the draft's log-softmax order (what the uncoupled drafter proposes)
- inside:   the draft's top-p set by noisy score z only
- coupled:  ``coupled_top``: the top-p set by z, then the other tokens by unfiltered noisy score u

Printed: hit@1..4 (the draw is among the first r candidates), how often the draw lies outside
the draft's top-p set, and for the score log softmax(u / τ) at several τ (and the softmax over z
alone) the log-loss of the draw and the mean predicted probability of each candidate rank.
Deterministic given the seed; 2-4 minutes on 2 CPU cores.

    python scripts/coupling_calibration.py --sets c4,oasst,mtbench,wikitext --n-prompts 2 --tokens 32
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from rapid.bench.prompts import load_sets, pick, truncate_ids
from rapid.core.geometry import causal_allowed
from rapid.core.sampling import (
    SamplingParams,
    gumbel_noise,
    log_softmax,
    noisy_scores,
    tempered,
    top_k_ids,
)
from rapid.runtime.coupling import coupled_top
from rapid.runtime.generate import open_edge_model
from rapid.server.main import load_target
from rapid.server.target import reference_decode

TAUS = (0.5, 1.0, 1.5, 2.0)
RANKS = 4


def collect(a: argparse.Namespace, params: SamplingParams) -> tuple[list[np.ndarray], list[int], list[int]]:
    """(draft logits row, absolute position, target's draw) for every sampled position."""
    edge = open_edge_model("default-draft-int4", "auto", 2048, 1)
    target, _ = load_target("default-target", "auto", 1)
    rows, pos, draws = [], [], []
    for set_name, prompts in load_sets(None, a.sets.split(",")).items():
        for p in pick(prompts, a.n_prompts):
            ids = truncate_ids(list(edge.tokenizer(p.text)["input_ids"]), a.token_budget)
            out = reference_decode(target, ids, a.tokens, params)
            full = ids + out
            edge.engine.reset()
            logits = edge.engine.step(full, list(range(len(full))), causal_allowed(0, len(full))).logits()
            for j, tok in enumerate(out):
                rows.append(logits[len(ids) + j - 1])
                pos.append(len(ids) + j)
                draws.append(tok)
            print(f"{set_name}/{p.id}: {len(out)} tokens", flush=True)
    return rows, pos, draws


def _lse(x: np.ndarray) -> float:
    m = x.max()
    return float(m + np.log(np.exp(x - m).sum()))


def analyse(rows, pos, draws, params: SamplingParams) -> None:
    n = len(draws)
    hits = {k: np.zeros(RANKS) for k in ("plain", "inside", "coupled")}
    loss = {t: 0.0 for t in TAUS} | {"z": 0.0}
    pred = {t: np.zeros(RANKS) for t in TAUS}
    outside, nucleus = 0, []
    for row, p, tok in zip(rows, pos, draws, strict=True):
        z = noisy_scores(row, p, params)
        u = tempered(row, params) + gumbel_noise(params, p, row.shape[0])
        inside = np.isfinite(z)
        nucleus.append(int(inside.sum()))
        outside += not inside[tok]
        coupled = [t for t, _ in coupled_top(row, p, params, RANKS)]
        ranked = {"plain": top_k_ids(log_softmax(row[None])[0], RANKS).tolist(),
                  "inside": top_k_ids(z, min(RANKS, int(inside.sum()))).tolist(), "coupled": coupled}
        for name, lst in ranked.items():
            if tok in lst:
                hits[name][lst.index(tok):] += 1
        for t in TAUS:
            lse = _lse(u / t)
            loss[t] -= u[tok] / t - lse
            pred[t] += [math.exp(u[c] / t - lse) for c in coupled]
        loss["z"] -= z[tok] - _lse(z[inside]) if inside[tok] else math.log(1e-12)
    print(f"positions {n}; the draw lies outside the draft's top-p set at {outside / n:.1%}; draft top-p set "
          f"size median {np.median(nucleus):g}, p90 {np.percentile(nucleus, 90):g}")
    for name, h in hits.items():
        print(f"{name:8s} hit@1..{RANKS} " + " / ".join(f"{x:.1%}" for x in h / n))
    emp = np.diff(np.concatenate([[0.0], hits["coupled"] / n]))
    print("coupled measured P(draw = rank r) " + " / ".join(f"{x:.3f}" for x in emp))
    for t in TAUS:
        print(f"score log softmax(u/{t:g}): log-loss {loss[t] / n:.3f} nats; predicted P(rank r) "
              + " / ".join(f"{x:.3f}" for x in pred[t] / n))
    print(f"score log softmax(z) (zero outside the top-p set, floor 1e-12): log-loss {loss['z'] / n:.3f} nats")


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
    analyse(*collect(a, params), params)


if __name__ == "__main__":
    main()
