"""Canned bench traces (no models): a folder shaped like ``rapid bench`` output."""

from __future__ import annotations

import json
import random
from dataclasses import asdict

import pytest

from rapid.bench.contention import parse_schedule
from rapid.bench.netem import get_profile
from rapid.runtime.telemetry import RoundRecord, summarize


def make_traces(folder, seed=0, policies=("fixed", "npdg", "rapid"), schedules=("none", "sustained"),
                repeats=3, rounds_per_run=12):
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"config": {"depth": 4, "budget": 8, "width": 2, "topk": 2, "max_new": 24, "repeats": repeats,
                       "n_prompts": 1, "engine": "torch"},
            "draft": "d", "target": "t", "net_mode": "transport", "net_fallback_reason": "test",
            "profiles": {"wan": asdict(get_profile("wan"))},
            "schedules": {s: asdict(parse_schedule(s)) for s in schedules}, "token_budget": 32,
            "prompts": {"c4": ["0"]}, "prompt_tokens": {"c4": [32]}, "edge_cpus": [0], "cloud_cpu": 1, "pinned": True}
    (folder / "meta.json").write_text(json.dumps(meta))
    with open(folder / "rounds.jsonl", "w") as fr, open(folder / "runs.jsonl", "w") as fu:
        for sched in schedules:
            slow = 2.0 if sched != "none" else 1.0
            for rep in range(repeats):
                for pol in policies:
                    t, recs, tokens = 0.3, [], 0
                    for i in range(rounds_per_run):
                        depth = 4 if pol != "rapid" else rng.choice([2, 3, 4])
                        acc = min(depth, rng.choice([0, 1, 2, 3, 4, 4]))
                        r = RoundRecord(i, pol, depth, 2 * depth, draft_steps=depth,
                                        draft_s=depth * 0.05 * slow * rng.uniform(0.9, 1.1),
                                        verify_s=0.05 + 0.01 * 2 * depth, accepted=acc, emitted=acc + 1)
                        r.cloud_s = r.verify_s + 0.032
                        r.wait_s = r.cloud_s
                        r.esr, r.eta = slow, 1 / slow if pol == "rapid" else 1.0
                        if pol != "fixed":
                            r.proactive_steps, r.proactive_hit = 2, rng.random() < 0.4
                            r.interrupted_at = 2 if pol == "rapid" else None
                        r.t_start, r.t_end = t, t + r.draft_s + r.wait_s
                        t = r.t_end
                        tokens += acc + 1
                        recs.append(r)
                    s = summarize(pol, recs, tokens, t + 0.1)
                    m = {"profile": "wan", "net_mode": "transport", "schedule": sched, "set": "c4",
                         "prompt_id": "0", "repeat": rep, "prompt_tokens": 32}
                    for r in recs:
                        row = asdict(r) | m | {"t_rel_start": r.t_start, "t_rel_end": r.t_end,
                                               "load": 0.0 if sched == "none" else 1.0,
                                               "contended": sched != "none"}
                        fr.write(json.dumps(row) + "\n")
                    row = {k: v for k, v in asdict(s).items() if k != "extra"} | m | {
                        "policy": pol, "digest": "abc", "per_token_s": s.wall_s / s.tokens,
                        "round_latencies": [r.t_end - r.t_start for r in recs]}
                    fu.write(json.dumps(row) + "\n")
    return folder


@pytest.fixture
def canned(tmp_path):
    return make_traces(tmp_path / "trace")
