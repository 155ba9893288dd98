import json
import time

import pytest


@pytest.mark.slow
def test_bench_smoke_end_to_end(tmp_path):
    from rapid.bench.cli import main_bench

    out = tmp_path / "smoke"
    out.mkdir()
    (out / "warmup.jsonl").write_text('{"stale": "a previous run in this folder"}\n')
    t0 = time.perf_counter()
    assert main_bench(["--smoke", "--out", str(out), "--no-progress"]) == 0
    assert time.perf_counter() - t0 < 90
    for f in ("rounds.jsonl", "runs.jsonl", "meta.json", "warmup.jsonl", "summary.csv", "report.md",
              "throughput.png", "controller.png", "timeline.png"):
        assert (out / f).exists() and (out / f).stat().st_size > 0, f
    warm = [json.loads(x) for x in (out / "warmup.jsonl").read_text().splitlines()]
    assert warm and all(r["schedule"] == "none" and r["load"] == 0.0 and "draft_s" in r for r in warm)  # not the stale row
    md = (out / "report.md").read_text()
    assert "vs fixed" in md and "identical tokens on" in md
    # lossless: every policy emitted the same tokens for each prompt cell
    digests = {}
    for line in (out / "runs.jsonl").read_text().splitlines():
        r = json.loads(line)
        digests.setdefault((r["schedule"], r["prompt_id"]), set()).add(r["digest"])
    assert all(len(v) == 1 for v in digests.values())
