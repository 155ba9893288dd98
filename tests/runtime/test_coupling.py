"""Coupled drafting (rapid.runtime.coupling): the first candidate is the target's own seeded pick
on the draft's logits, the rest follow by noisy score (the draft's top-k / top-p set first), the
score is the log-softmax of the unfiltered noisy scores; the opt-out reaches TreeParams from
every command that takes tree options."""

from __future__ import annotations

import argparse
import math
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapid.bench.cli import bench_parser
from rapid.core import sampling
from rapid.core.sampling import SamplingParams, filtered_logits, noisy_scores, pick_tokens
from rapid.runtime.coupling import coupled_top
from rapid.runtime.edge_config import EdgeConfig, add_edge_args

params_st = st.builds(SamplingParams, temperature=st.sampled_from([0.3, 0.7, 1.0, 1.7]),
                      top_p=st.sampled_from([1.0, 0.95, 0.8, 0.3]), top_k=st.sampled_from([0, 1, 3, 20]),
                      seed=st.integers(0, 2**40))


@settings(max_examples=80, deadline=None)
@given(params=params_st, seed=st.integers(0, 2**32 - 1), vocab=st.integers(2, 300),
       position=st.integers(0, 5000), k=st.integers(1, 8), scale=st.sampled_from([0.5, 3.0, 12.0]))
def test_first_candidate_is_the_seeded_pick_and_the_rest_follow_by_noisy_score(params, seed, vocab, position, k,
                                                                               scale):
    row = np.random.default_rng(seed).normal(0.0, scale, size=vocab).astype(np.float32)
    best = coupled_top(row, position, params, k)
    assert best[0][0] == int(pick_tokens(row[None], np.array([position]), params)[0])
    z = noisy_scores(row, position, params)
    u = row.astype(np.float64) / params.temperature + sampling._gumbel(params.seed, position, vocab)
    kept = np.flatnonzero(np.isfinite(filtered_logits(row, params))).tolist()
    rest = sorted(set(range(vocab)) - set(kept), key=lambda t: (-u[t], t))
    want = sorted(kept, key=lambda t: (-z[t], t)) + rest  # the draft's top-p set first, then the others
    assert [t for t, _ in best] == want[: min(k, vocab)]
    scores = [s for _, s in best]
    assert all(s <= 0.0 for s in scores)
    n_in = min(len(kept), len(best))
    assert scores[:n_in] == sorted(scores[:n_in], reverse=True)  # inside the set, score order = rank order
    full = dict(coupled_top(row, position, params, vocab))  # a distribution over the whole vocabulary
    assert sorted(full) == list(range(vocab))
    assert math.isclose(sum(math.exp(s) for s in full.values()), 1.0, rel_tol=1e-9)
    lse = np.log(np.exp(u - u.max()).sum()) + u.max()
    assert all(math.isclose(full[t], u[t] - lse, rel_tol=1e-12, abs_tol=1e-12) for t in range(vocab))


def test_same_position_same_noise_other_position_other_draw():
    row = np.zeros(1000, dtype=np.float32)  # flat logits: the noise alone decides
    p = SamplingParams(temperature=1.0, seed=5)
    assert coupled_top(row, 7, p, 3) == coupled_top(row.copy(), 7, p, 3)
    assert coupled_top(row, 7, p, 1)[0][0] != coupled_top(row, 8, p, 1)[0][0]


def test_greedy_and_bad_tau_are_refused():
    row = np.zeros(4, dtype=np.float32)
    with pytest.raises(ValueError, match="sampling"):
        coupled_top(row, 0, SamplingParams(), 2)
    with pytest.raises(ValueError, match="tau"):
        coupled_top(row, 0, SamplingParams(temperature=1.0), 2, tau=0.0)


def test_opt_out_reaches_tree_params_and_the_bench():
    ap = argparse.ArgumentParser()
    add_edge_args(ap, "tree")
    assert EdgeConfig.of(ap.parse_args([])).tree().coupled is True
    assert EdgeConfig.of(ap.parse_args(["--no-coupled"])).tree().coupled is False
    assert EdgeConfig.of(ap.parse_args(["--no-coupled", "--budget", "9"])).tree().budget == 9
    a = bench_parser().parse_args(["--temperature", "0.7", "--top-p", "0.8", "--no-coupled"])
    assert (a.temperature, a.top_p, a.coupled) == (0.7, 0.8, False)
    assert bench_parser().parse_args([]).coupled is True


@pytest.mark.parametrize("cmd", [("generate", "x"), ("demo",), ("edge",)])
def test_every_tree_command_offers_the_opt_out(cmd):
    out = subprocess.run([sys.executable, "-m", "rapid.cli", *cmd, "--help"], capture_output=True, text=True,
                         timeout=60).stdout
    assert "--no-coupled" in out
