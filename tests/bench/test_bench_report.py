import csv

from rapid.bench.report import aggregate, ratios, read_jsonl, write_report


def test_report_writes_every_file(canned):
    files = write_report(canned)
    for key in ("summary", "report", "throughput", "controller", "timeline"):
        assert files[key].exists() and files[key].stat().st_size > 0, key
    assert files["throughput"].read_bytes()[:4] == b"\x89PNG"
    rows = list(csv.DictReader(open(files["summary"])))
    assert len(rows) == 6 and {r["policy"] for r in rows} == {"fixed", "npdg", "rapid"}
    md = files["report"].read_text()
    for needle in ("EMULATED in the transport", "last **32 tokens**", "vs fixed", "throughput tok/s",
                   "p95 round ms", "proactive hit rate", "discarded expansions", "identical tokens on 2/2"):
        assert needle in md, needle


def test_ratios_against_fixed(canned):
    rows = aggregate(read_jsonl(canned / "runs.jsonl"))
    rat = ratios(rows)
    fixed = [r for r in rat if r["policy"] == "fixed"]
    assert all(abs(r["vs_fixed"] - 1) < 1e-12 for r in fixed)
    assert all("vs_npdg" in r for r in rat)
    for r in rows:
        assert r["tok_s_min"] <= r["tok_s"] <= r["tok_s_max"] and r["runs"] == 3
        assert r["round_p50_ms"] <= r["round_p95_ms"]


def test_target_check_says_met_or_by_how_much():
    from rapid.bench.report import target_check

    rat = [{"profile": "wan", "schedule": "sustained", "set": "c4", "policy": "rapid", "vs_fixed": 1.17,
            "vs_npdg": 1.21},
           {"profile": "wan", "schedule": "none", "set": "c4", "policy": "rapid", "vs_fixed": 1.02},
           {"profile": "wan", "schedule": "burst:4:4", "set": "c4", "policy": "rapid", "vs_fixed": 0.5}]
    got = {(t["schedule"], t["ratio"]): t for t in target_check(rat)}
    assert set(got) == {("sustained", "rapid/fixed"), ("sustained", "rapid/npdg"), ("none", "rapid/fixed")}
    assert not got[("sustained", "rapid/fixed")]["met"]
    assert abs(got[("sustained", "rapid/fixed")]["short_by"] - 0.1) < 1e-9  # 1.17 is 10 % short of 1.3
    assert got[("sustained", "rapid/npdg")]["met"] and got[("none", "rapid/fixed")]["met"]


def test_report_lists_the_targets(canned):
    md = write_report(canned, plots=False)["report"].read_text()
    assert "## Targets" in md and "rapid/fixed" in md and ("met" in md or "missed by" in md)


def test_report_splits_time_to_first_token_from_the_rest(canned):
    md = write_report(canned, plots=False)["report"].read_text()
    assert "## Time to first token" in md and "| wan | sustained | c4 | rapid | 3 |" in md


def test_report_states_the_sampling_setting(canned):
    import json

    meta = json.loads((canned / "meta.json").read_text())
    assert "greedy;" in write_report(canned, plots=False)["report"].read_text()  # canned: greedy
    try:
        for coupled, says in ((True, "coupled drafting"), (False, "uncoupled drafting (--no-coupled)")):
            cfg = dict(meta["config"], temperature=0.7, top_p=0.8, seed=3, coupled=coupled)
            (canned / "meta.json").write_text(json.dumps(dict(meta, config=cfg)))
            md = write_report(canned, plots=False)["report"].read_text()
            assert f"sampling temperature 0.7, top-p 0.8, seed 3, {says};" in md
    finally:
        (canned / "meta.json").write_text(json.dumps(meta))


def _run(policy, prompt, repeat, tokens, wall):
    return {"profile": "wan", "schedule": "none", "set": "c4", "policy": policy, "prompt_id": prompt,
            "repeat": repeat, "tokens": tokens, "wall_s": wall, "tokens_per_s": tokens / wall,
            "per_token_s": wall / tokens, "round_latencies": [wall], "mean_accepted": 1.0, "tokens_per_call": 2.0,
            "hit_rate": None, "interrupts": 0, "discarded_ratio": 0.0, "mean_depth": 1.0}


def test_a_cells_throughput_pools_its_prompts_per_repeat_then_takes_the_median_over_repeats():
    """The runs' own median would set one prompt against another: here `a` reads 2.5 tok/s (its
    middle prompt) and `b` 4.0, though over the same three prompts `a` takes 10 s and `b` 8 s."""
    runs = [_run("a", p, 0, 10, w) for p, w in (("0", 1.0), ("1", 4.0), ("2", 5.0))]
    runs += [_run("b", p, 0, 10, w) for p, w in (("0", 2.0), ("1", 2.5), ("2", 3.5))]
    runs += [_run("a", p, 1, 10, 2 * w) for p, w in (("0", 1.0), ("1", 4.0), ("2", 5.0))]
    rows = {r["policy"]: r for r in aggregate(runs)}
    assert rows["a"]["tok_s"] == 2.25 and (rows["a"]["tok_s_min"], rows["a"]["tok_s_max"]) == (1.5, 3.0)
    assert rows["b"]["tok_s"] == 3.75 and rows["a"]["runs"] == 6
