"""rapid.runtime.lookup: prompt-lookup continuations against a brute-force reference."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rapid.runtime.lookup import DECAY, P_MAX, PRIOR_WEIGHT, LookupStats, lookup_continuations


def reference(ctx: list[int], length: int, branches: int, max_ngram: int, min_ngram: int) -> list[list[int]]:
    out: list[list[int]] = []
    for n in range(max_ngram, min_ngram - 1, -1):
        if n >= len(ctx):
            continue
        for j in range(len(ctx) - 1, n - 1, -1):
            if ctx[j - n: j] == ctx[-n:]:
                cont = ctx[j: j + length]
                if not any(p[: len(cont)] == cont for p in out):
                    out.append(cont)
                    if len(out) == branches:
                        return out
    return out


@settings(max_examples=300, deadline=None)
@given(ctx=st.lists(st.integers(0, 4), max_size=40), length=st.integers(1, 6), branches=st.integers(1, 3),
       max_ngram=st.integers(1, 4), drop=st.integers(0, 3))
def test_matches_brute_force(ctx, length, branches, max_ngram, drop):
    min_ngram = max(1, max_ngram - drop)
    got = lookup_continuations(ctx, length, branches, max_ngram, min_ngram)
    assert got == reference(ctx, length, branches, max_ngram, min_ngram)
    for cont in got:
        assert 1 <= len(cont) <= length


def test_most_recent_longest_match_first():
    ctx = [1, 2, 3, 9, 8, 2, 3, 7, 1, 2, 3]
    # last 3-gram [1, 2, 3] occurs at the start -> 9 8 2; the 2-gram [2, 3] also after 8 -> 7 1 2
    assert lookup_continuations(ctx, 3, branches=2, max_ngram=3, min_ngram=2) == [[9, 8, 2], [7, 1, 2]]
    assert lookup_continuations(ctx, 3, branches=1) == [[9, 8, 2]]
    assert lookup_continuations([1, 2, 3, 4], 3) == []
    assert lookup_continuations([], 3) == [] and lookup_continuations([5], 3) == []
    assert lookup_continuations(ctx, 0) == []


def test_bad_ngram_range_is_an_error():
    with pytest.raises(ValueError):
        lookup_continuations([1, 2], 2, max_ngram=1, min_ngram=2)


def test_stats_learn_from_verdicts():
    s = LookupStats(prior=0.5)
    assert s.p == 0.5
    for _ in range(20):
        s.observe([[1, 2, 3, 4]], [1, 2, 3, 4, 5])  # always right (censored: no mismatch seen)
    assert s.p == P_MAX
    s = LookupStats(prior=0.5)
    for _ in range(40):
        s.observe([[7, 8]], [1, 2])  # always wrong at the first token
    assert s.p < 0.1  # the prior keeps ~1 pseudo-hit in a decayed window of ~10 tries
    s = LookupStats(prior=0.5)
    s.observe([[1, 2, 9], [5]], [1, 2, 3])  # 2 hits + 1 miss, then 0 hits + 1 miss
    assert s.hits == 2 and s.tries == 4
    assert s.p == pytest.approx((2 + PRIOR_WEIGHT * 0.5) / (4 + PRIOR_WEIGHT))
    s.observe([], [1])
    assert s.hits == pytest.approx(2 * DECAY) and s.tries == pytest.approx(4 * DECAY)
