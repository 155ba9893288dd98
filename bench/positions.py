"""What the traced rounds saw at each position of a prompt's generation (the simulator's
acceptance replay, ``rapid.bench.calibration.fit_acceptance``).

Every policy emits the target's tokens, so position ``p`` of a prompt's generation is the same
token in every run of that prompt (any policy, schedule or repeat): what one round learnt there
holds for all. A round starts at the tokens its run emitted before it (``emitted``; older traces:
``accepted + 1``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

Key = tuple  # (set, prompt_id)


def sent_levels(r: dict) -> int:
    """Levels of the tree a round sent (its accepted length never exceeds them)."""
    return max(int(r.get("tree_depth") or r["depth"]), r["accepted"], 1)


def rounds_at(by_run: dict[tuple, list[dict]]) -> Iterator[tuple[dict, int]]:
    """Every run's rounds in order (as ``traces.with_previous``), each with its start position."""
    for rs in by_run.values():
        at = 0
        for r in sorted(rs, key=lambda x: x["round"]):
            yield r, at
            at += int(r.get("emitted", r["accepted"] + 1))


def bits_by_position(by_run: dict[tuple, list[dict]]) -> dict[Key, dict[int, tuple[int, int]]]:
    """{(set, prompt): {position: (accepted, rejected)}}: how often a drafting round that sent a
    level at that position had it accepted. A fully accepted round says nothing of the position
    after its tree; another round there (a deeper tree, another policy or repeat) may have sent
    a level at it."""
    out: dict[Key, dict[int, list[int]]] = defaultdict(dict)
    for r, at in rounds_at(by_run):
        if r.get("depth", 0) <= 0:
            continue
        n = sent_levels(r)
        a = min(r["accepted"], n)
        here = out[(r.get("set"), r.get("prompt_id"))]
        for j in range(min(a + 1, n)):
            here.setdefault(at + j, [0, 0])[0 if j < a else 1] += 1
    return {k: {p: (c[0], c[1]) for p, c in v.items()} for k, v in out.items()}


def chains_by_position(by_run: dict[tuple, list[dict]]) -> dict[Key, dict[int, int]]:
    """{(set, prompt): {position: levels}}: the prompt-lookup chains that rounds which drafted
    nothing (``rapid-cost`` at depth 0) sent, alone and whole, by where they started, counting
    down along the accepted run; such a chain is offered there whatever the policy. The replay's
    bits come from drafting rounds only; without this those chains were never replayed, and on
    oasst (copy rounds) the simulated ``rapid-cost`` was 28-38 % slow (a chain where the traced
    run had one in about half its rounds)."""
    out: dict[Key, dict[int, int]] = defaultdict(dict)
    for r, at in rounds_at(by_run):
        if r.get("depth", 0) > 0:
            continue
        lookup = int(r.get("lookup_depth", r.get("tree_depth") or 0))  # its tree is the chain alone
        here = out[(r.get("set"), r.get("prompt_id"))]
        for j in range(min(r["accepted"], lookup) + 1):
            here[at + j] = max(here.get(at + j, 0), lookup - j)
    return out
