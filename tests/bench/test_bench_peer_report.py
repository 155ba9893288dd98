"""rapid.bench.peer_report: the peers' ratios and the accepted-length ceiling, from canned rows."""

from __future__ import annotations

import json

import pytest

from rapid.bench.peer_report import (
    ceiling_lines,
    ceiling_rows,
    dropped_draft_s,
    peer_lines,
    peer_ratios,
    peer_tok_s,
    peer_tok_s_lines,
)
from rapid.bench.report import write_report


def _peer(pset, pid, rep, method, tokens, seconds):
    return {"set": pset, "prompt_id": pid, "repeat": rep, "method": method, "tokens": tokens, "seconds": seconds,
            "digest": "x"}


def _peers():
    rows = []
    for rep, jitter in enumerate((1.0, 1.2, 0.9)):
        rows += [_peer("c4", "0", rep, "hf-plain", [1, 2, 3, 4], 4.0 * jitter),
                 _peer("c4", "0", rep, "hf-assisted", [1, 2, 3, 4], 2.0 * jitter),
                 _peer("c4", "0", rep, "hf-lookup", [1, 2, 3, 4] if rep else [1, 2, 9, 9], 4.0 * jitter),
                 _peer("c4", "1", rep, "hf-plain", [5, 6], 2.0),
                 _peer("c4", "1", rep, "hf-assisted", [5, 6], 0.5),
                 _peer("c4", "1", rep, "hf-lookup", [5, 6], 1.0)]
    return rows


def test_peer_ratios_pool_the_sets_prompts_per_repeat_then_take_the_median_over_repeats():
    """Per repeat: 6 tokens over both prompts' seconds. hf-plain 6 / (4j + 2) for j = 1, 1.2, 0.9:
    1.0, 0.88, 1.07; hf-assisted 6 / (2j + 0.5): 2.4, 2.07, 2.61; hf-lookup 6 / (4j + 1): 1.2,
    1.03, 1.30. The per-prompt ratios (2 and 4 for hf-assisted) would have given 3.0: the prompt
    that takes a quarter of the time would count as much as the other."""
    pr = peer_ratios(_peers())
    assert pr["c4"]["hf-assisted"] == (pytest.approx(2.4), 2, 2)
    assert pr["c4"]["hf-lookup"] == (pytest.approx(1.2), 1, 2)  # prompt 0 differed once


def test_peer_lines_say_whether_rapid_leads_every_peer():
    lines = peer_lines(_peers(), {"c4": 3.5})
    row = next(x for x in lines if x.startswith("| c4"))
    assert row == "| c4 | 3.50 | 2.40 | 2/2 | 1.20 | 1/2 | yes |"
    assert peer_lines(_peers(), {"c4": 2.3})[-1].endswith("| no |")
    assert peer_lines([], {"c4": 3.5}) == []


def test_peer_tok_s_puts_every_method_on_one_scale():
    """Each ratio has its own denominator; the tok/s table shows who is fastest outright: here
    hf-assisted's ratio (2.4) is its own: rapid's tok/s decides who is fastest outright."""
    tps = peer_tok_s(_peers())
    assert tps["c4"]["hf-plain"] == pytest.approx(1.0)  # repeat 0: 6 tokens in 4 s + 2 s
    assert tps["c4"]["hf-assisted"] == pytest.approx(2.4)  # repeat 0: 6 tokens in 2 s + 0.5 s
    lines = peer_tok_s_lines(_peers(), {"c4": {"rapid": 5.0, "ar": 2.0}})
    row = next(x for x in lines if x.startswith("| c4"))
    assert row == "| c4 | 5.00 | 2.00 | 1.00 | 2.40 | 1.20 | rapid |"
    slow = next(x for x in peer_tok_s_lines(_peers(), {"c4": {"rapid": 2.3, "ar": 2.0}}) if x.startswith("| c4"))
    assert slow.endswith("| hf-assisted |")
    assert peer_tok_s_lines([], {"c4": {"rapid": 5.0}}) == []


def test_ceiling_rows_use_rapids_rounds_and_ars_one_token_verify():
    rounds = [{"set": "c4", "policy": "rapid", "schedule": "none", "accepted": a, "emitted": a + 1, "tree_nodes": 6,
               "verify_s": 0.15, "tree_depth": 4, "draft_steps": 3, "draft_s": 0.06} for a in (1, 3)]
    rounds += [{"set": "c4", "policy": "ar", "schedule": "none", "verify_s": 0.1, "accepted": 0, "emitted": 1}]
    rounds += [dict(rounds[0], schedule="sustained", accepted=0)]
    (row,) = ceiling_rows(rounds)
    assert row["accepted"] == 2 and row["per_verify"] == 3 and row["ideal"] == 4
    assert row["verify_ms"] == pytest.approx(150) and row["t1_ms"] == pytest.approx(100)
    assert ceiling_lines(rounds)[-1] == "| c4 | 2.00 | 3.00 | 6 | 150 | 100 | 4.00 | 3.00 | 60 | 0.00 | 0 |"
    assert ceiling_lines(rounds, "rapid-cost") == []  # another policy's rounds: none here
    assert "(rapid-cost's rounds" in ceiling_lines(
        [dict(r, policy="rapid-cost") if r["policy"] == "rapid" else r for r in rounds], "rapid-cost")[1]


def test_the_ceiling_counts_the_drafting_of_levels_the_round_did_not_send():
    """Round 0 planned 4, drafted 4 steps (20 ms each), sent 2 levels: 2 steps dropped; its kept
    branch supplied 3 levels of round 1, which drafted 2 more and sent 4: 1 step dropped. The
    other generation's round 1 follows its own round 0 (no branch kept), not this one's."""
    base = {"set": "c4", "policy": "rapid-cost", "schedule": "none", "profile": "lan", "prompt_id": "0",
            "repeat": 0, "accepted": 1, "emitted": 2, "tree_nodes": 4, "verify_s": 0.1}
    rounds = [dict(base, round=0, depth=4, tree_depth=2, draft_steps=4, draft_s=0.08, reused_depth=3),
              dict(base, round=1, depth=5, tree_depth=4, draft_steps=2, draft_s=0.04, reused_depth=0),
              dict(base, repeat=1, round=0, depth=2, tree_depth=2, draft_steps=2, draft_s=0.04, reused_depth=0),
              dict(base, repeat=1, round=1, depth=2, tree_depth=1, lookup_depth=2, draft_steps=2, draft_s=0.04)]
    assert dropped_draft_s(rounds) == pytest.approx([0.04, 0.02, 0.0, 0.0])
    (row,) = ceiling_rows(rounds, "rapid-cost")
    assert row["unsent"] == pytest.approx((2 + 1 + 0 + 0) / 4) and row["dropped_ms"] == pytest.approx(15)


def test_report_includes_both_sections(canned):
    with open(canned / "peers.jsonl", "w") as f:
        for r in _peers():
            f.write(json.dumps(r) + "\n")
    text = write_report(canned, plots=False)["report"].read_text()
    assert "## Peers" in text and "## Where the accepted length stops" in text
