"""A bench folder's round traces (``rounds.jsonl``) by generation: one run is one policy's
generation of one prompt, in one profile, schedule and repeat; its rounds walked in order, each
with the round before it (what that round's proactive branch left to this one)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator


def run_key(r: dict) -> tuple:
    """The generation a round or a run record belongs to."""
    return (r.get("profile"), r.get("schedule"), r.get("set"), r.get("prompt_id"), r.get("repeat"), r.get("policy"))


def group_runs(rounds: list[dict]) -> dict[tuple, list[dict]]:
    g: dict[tuple, list[dict]] = defaultdict(list)
    for r in rounds:
        g[run_key(r)].append(r)
    return g


def with_previous(by_run: dict[tuple, list[dict]]) -> Iterator[tuple[dict, dict | None]]:
    """Every run's rounds by round number, each with the round before it (None for the first)."""
    for rs in by_run.values():
        prev = None
        for r in sorted(rs, key=lambda x: x["round"]):
            yield r, prev
            prev = r
