"""``rapid bench`` presets and flags: the draft a run uses."""

from __future__ import annotations

from pathlib import Path

from rapid.bench.cli import SLOW_EDGE, bench_config, bench_parser
from rapid.runtime.edge_config import DEFAULT


def _draft(*argv: str) -> str:
    return bench_config(bench_parser().parse_args(list(argv)), Path("unused")).draft


def test_the_slow_edge_preset_takes_its_draft_unless_one_is_named():
    assert _draft("--slow-edge") == SLOW_EDGE["draft"] != DEFAULT.draft
    # naming the edge's default draft is a choice too (it used to be read as "unset")
    assert _draft("--slow-edge", "--draft", DEFAULT.draft) == DEFAULT.draft
    assert _draft() == DEFAULT.draft
    assert _draft("--quick", "--draft", "my-export") == "my-export"
