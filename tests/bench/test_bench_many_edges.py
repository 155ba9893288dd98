"""The many-edges bench's figures (rapid.bench.many_edges): per-forward deltas and the row."""

from __future__ import annotations

from rapid.bench.many_edges import _per_forward, _row


def test_per_forward_figures_are_the_waves_deltas():
    before = {"trees": 10.0, "forwards": 8.0, "forward_s": 2.0, "nodes": 40.0}
    after = {"trees": 22.0, "forwards": 12.0, "forward_s": 3.2, "nodes": 88.0}
    f = _per_forward(before, after)
    assert f["trees"] == 3.0 and f["rows"] == (48 + 12) / 4 and abs(f["ms"] - 300.0) < 1e-9
    assert _per_forward(before, before)["trees"] == 0.0  # no forward: no division by zero


def test_a_row_takes_medians_over_waves_and_percentiles_over_tokens():
    runs = [{"tokens": [1] * 10, "wall": 2.0, "gaps": [0.1] * 9 + [1.0]},
            {"tokens": [1] * 20, "wall": 5.0, "gaps": [0.2] * 20}]
    waves = [(runs, 5.0, {"trees": 2.0, "rows": 10.0, "ms": 200.0})] * 3
    r = _row(2, "rapid", waves)
    assert r["aggregate_tok_s"] == 6.0 and r["per_edge_tok_s"] == 4.5  # 30 tokens / 5 s; median(5, 4)
    assert r["p50_ms_per_token"] == 200.0 and r["p99_ms_per_token"] == 1000.0
    assert (r["trees_per_forward"], r["rows_per_forward"], r["ms_per_forward"]) == (2.0, 10.0, 200.0)
