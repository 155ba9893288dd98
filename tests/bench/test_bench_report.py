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
