"""rapid.bench.peers: HF plain / assisted / prompt-lookup generation on tiny random checkpoints."""

from __future__ import annotations

import json

from rapid.bench.peers import PEERS, run_peers


def test_run_peers_writes_one_row_per_method_prompt_and_repeat(tiny_dir, tmp_path):
    target = tiny_dir("target", seed=0)
    draft = tiny_dir("draft-partial", seed=1, base_seed=0, perturb=0.05)
    ids = [3, 4, 5, 6, 3, 4, 5, 6, 3, 4]  # repeats: prompt lookup has something to match
    seen = []
    run_peers(target, draft, "float32", {"c4": [("0", ids)], "oasst": [("1", ids[:5])]}, 6, 2, tmp_path,
              seen.append)
    rows = [json.loads(x) for x in (tmp_path / "peers.jsonl").read_text().splitlines()]
    assert len(rows) == len(seen) == 3 * 2 * 2
    assert {r["method"] for r in rows} == set(PEERS)
    for r in rows:
        assert 1 <= len(r["tokens"]) <= 6 and r["seconds"] > 0
    plain = {(r["set"], r["repeat"]): r["tokens"] for r in rows if r["method"] == "hf-plain"}
    assert plain[("c4", 0)] == plain[("c4", 1)]  # greedy: the baseline repeats itself
