"""Two report sections of a ``rapid bench`` folder: the peers, and where the accepted length stops.

Peers (``peers.jsonl``, ``rapid.bench.peers``): per set, rapid's tok/s over ``ar`` next to each HF
peer's over ``hf-plain``, every one measured as the bench's cells are: per repeat, tokens over
seconds on the set's prompts together, then the median over repeats; ``same`` counts prompts whose
every repeat emitted hf-plain's tokens. A second table gives the tokens per second themselves
(ours from the bench's summary), since each ratio has its own denominator: HF's plain
``generate`` ran at half ``ar``'s speed on the Zen 4 (3.2 against 6.5 tok/s), so a peer can lead
by its own ratio while being slower than rapid.

Ceiling (``rounds.jsonl``, the ``rapid`` policy's rounds): per set,

    accepted / round      mean accepted draft nodes (the bonus token not counted)
    tokens / verify       mean emitted per target call (accepted + bonus)
    nodes sent            median tree size, and the median verify ms of those trees
    T=1 verify ms         median verify of ``ar``'s one-token rounds (the flat curve's left end)
    ideal                 mean depth of the trees sent: the accepted length had the target's path
                          been in every tree (the shape and the draft lose the difference)
    steps / round         mean draft steps (CAAC's depth), draft ms / round their mean time
    planned, not sent     mean levels the round planned (its depth) and sent no node at: not
                          drafted (the send cut stopped the drafting) or drafted and cut
    dropped draft ms      mean critical-path drafting of levels past the sent tree's depth: a
                          step drafts a level, after the levels a kept branch supplied (the
                          previous round's ``reused_depth``); round 0's part before Ready left out.
                          Where the plan and the cut disagree, this is what it costs (7-12 % of
                          rapid-cost's wall time before the drafting asked the cut, docs/results.md)
"""

from __future__ import annotations

import statistics
from collections import defaultdict

from rapid.bench.md_table import cell, md_table
from rapid.bench.paired_runs import pooled_by_repeat

PEER_RATIOS = (("hf-assisted", "hf-plain"), ("hf-lookup", "hf-plain"))


def _pooled_tok_s(rows: list[dict]) -> dict[tuple[str, str], float]:
    """(set, method) → median over repeats of the repeat's tokens over seconds on the set's prompts
    (the bench's own cells are measured so: ``rapid.bench.report.aggregate``)."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["set"], r["method"])].append({"repeat": r["repeat"], "tokens": len(r["tokens"]),
                                                "wall_s": r["seconds"]})
    return {k: statistics.median(reps.values()) for k, v in groups.items() if (reps := pooled_by_repeat(v))}


def peer_ratios(peers: list[dict]) -> dict[str, dict[str, tuple[float, int, int]]]:
    """set → method → (its tok/s over hf-plain's, both pooled over the set's prompts per repeat and
    the median taken over repeats; prompts identical to hf-plain in every repeat, prompts)."""
    tps = _pooled_tok_s(peers)
    plain = {(r["set"], r["prompt_id"], r["repeat"]): r["tokens"] for r in peers if r["method"] == "hf-plain"}
    out: dict[str, dict[str, tuple[float, int, int]]] = defaultdict(dict)
    for method, base in PEER_RATIOS:
        for (pset, m), v in tps.items():
            if m != method or not tps.get((pset, base)):
                continue
            pids = sorted({r["prompt_id"] for r in peers if r["set"] == pset and r["method"] == method})
            same = sum(all(r["tokens"] == plain.get((pset, pid, r["repeat"])) for r in peers
                           if r["set"] == pset and r["prompt_id"] == pid and r["method"] == method) for pid in pids)
            out[pset][method] = (v / tps[(pset, base)], same, len(pids))
    return dict(out)


def peer_tok_s(peers: list[dict]) -> dict[str, dict[str, float]]:
    """set → method → tok/s pooled over the set's prompts per repeat, the median over repeats."""
    out: dict[str, dict[str, float]] = defaultdict(dict)
    for (pset, method), v in _pooled_tok_s(peers).items():
        out[pset][method] = v
    return dict(out)


def peer_tok_s_lines(peers: list[dict], ours: dict[str, dict[str, float]], policy: str = "rapid") -> list[str]:
    """Tokens per second of ``policy``, ``ar`` and each HF method per set (``ours``: set → policy →
    median tok/s, one profile, no load), and the fastest of them."""
    if not peers:
        return []
    theirs = peer_tok_s(peers)
    methods = [policy, "ar", "hf-plain", *(m for m, _ in PEER_RATIOS)]
    rows = []
    for pset in sorted(set(theirs) | set(ours)):
        vals = {**{m: v for m, v in ours.get(pset, {}).items() if m in (policy, "ar")}, **theirs.get(pset, {})}
        rows.append([pset, *(cell(vals.get(m), ".2f") for m in methods), max(vals, key=vals.get) if vals else "-"])
    return ["", "Tokens per second (the same prompts; each ratio above has its own denominator):", ""] + md_table(
        ["set", *(f"{m} tok/s" for m in methods), "fastest"], rows)


def peer_lines(peers: list[dict], rapid_vs_ar: dict[str, float], policy: str = "rapid") -> list[str]:
    """The peers table; ``rapid_vs_ar``: set → ``policy``'s median tok/s over ar (one profile, no load)."""
    if not peers:
        return []
    pr = peer_ratios(peers)
    L = ["", "## Peers: each one's ratio to its own target-alone run", "",
         "HF transformers on the same prompts, pair (PyTorch draft) and dtype, greedy, 1 thread, on the "
         "cloud's core (`rapid.bench.peers`).", ""]
    rows = []
    for pset in sorted(set(pr) | set(rapid_vs_ar)):
        mine = rapid_vs_ar.get(pset)
        cells, ahead = [], mine is not None
        for method, _ in PEER_RATIOS:
            v = pr.get(pset, {}).get(method)
            cells += ["-", "-"] if v is None else [f"{v[0]:.2f}", f"{v[1]}/{v[2]}"]
            ahead = ahead and (v is None or mine > v[0])
        rows.append([pset, cell(mine, ".2f"), *cells, "yes" if ahead else "no"])
    return L + md_table(["set", f"{policy}/ar", "hf-assisted/hf-plain", "same tokens", "hf-lookup/hf-plain",
                         "same tokens", "rapid ahead"], rows)


def _sent_depth(r: dict) -> int:
    """The depth of the tree a round sent: its drafted nodes' or its lookup chain's, the deeper."""
    return max(r.get("tree_depth", 0), r.get("lookup_depth", 0))


def dropped_draft_s(rs: list[dict]) -> list[float]:
    """Per round of ``rs`` (one policy's rounds, any order), the critical-path seconds spent
    drafting levels past the sent tree's depth (module docstring)."""
    def key(r: dict, k: int) -> tuple:
        return r.get("profile"), r.get("schedule"), r.get("set"), r.get("prompt_id"), r.get("repeat"), k

    reused = {key(r, r.get("round", 0)): r.get("reused_depth", 0) for r in rs}
    out = []
    for r in rs:
        steps, k = r["draft_steps"], r.get("round", 0)
        if not steps:
            out.append(0.0)
            continue
        have = reused.get(key(r, k - 1), 0) if k > 0 else 0
        past = min(steps, max(0, have + steps - _sent_depth(r)))
        out.append(past * max(0.0, r["draft_s"] - r.get("ahead_s", 0.0)) / steps)
    return out


def ceiling_rows(rounds: list[dict], policy: str = "rapid") -> list[dict]:
    """Per set, the module docstring's ceiling columns from the ``policy``'s and ar's rounds."""
    by_set: dict[str, list[dict]] = defaultdict(list)
    t1: dict[str, list[float]] = defaultdict(list)
    for r in rounds:
        if r.get("schedule", "none") != "none":
            continue
        if r["policy"] == policy:
            by_set[r["set"]].append(r)
        elif r["policy"] == "ar":
            t1[r["set"]].append(r["verify_s"])
    out = []
    for pset, rs in sorted(by_set.items()):
        out.append({
            "set": pset, "accepted": statistics.fmean(r["accepted"] for r in rs),
            "per_verify": statistics.fmean(r["emitted"] for r in rs),
            "nodes": statistics.median(r["tree_nodes"] for r in rs),
            "verify_ms": 1000 * statistics.median(r["verify_s"] for r in rs),
            "t1_ms": 1000 * statistics.median(t1[pset]) if t1.get(pset) else None,
            "ideal": statistics.fmean(r.get("tree_depth", 0) for r in rs),
            "steps": statistics.fmean(r["draft_steps"] for r in rs),
            "draft_ms": 1000 * statistics.fmean(r["draft_s"] for r in rs),
            "unsent": statistics.fmean(max(0, r.get("depth", 0) - _sent_depth(r)) for r in rs),
            "dropped_ms": 1000 * statistics.fmean(dropped_draft_s(rs)),
        })
    return out


def ceiling_lines(rounds: list[dict], policy: str = "rapid") -> list[str]:
    rows = ceiling_rows(rounds, policy)
    if not rows:
        return []
    L = ["", f"## Where the accepted length stops ({policy}'s rounds, no load)", ""]
    return L + md_table(["set", "accepted / round", "tokens / verify", "nodes sent", "verify ms", "T=1 verify ms",
                         "ideal (tree depth)", "steps / round", "draft ms / round", "planned, not sent",
                         "dropped draft ms"],
                        ([r["set"], f"{r['accepted']:.2f}", f"{r['per_verify']:.2f}", f"{r['nodes']:.0f}",
                          f"{r['verify_ms']:.0f}", cell(r["t1_ms"], ".0f"), f"{r['ideal']:.2f}", f"{r['steps']:.2f}",
                          f"{r['draft_ms']:.0f}", f"{r['unsent']:.2f}", f"{r['dropped_ms']:.0f}"] for r in rows))
