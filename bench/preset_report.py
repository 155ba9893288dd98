"""``rapid sim --preset``: every policy against ``oracle`` and ``oracle-load`` in the deployment
regime (``bench.presets``), acceptance replayed per prompt set from the traces; writes
``presets.md`` / ``presets.json`` (the model is ``bench.sim``)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from rapid.bench.calibration import Calibration
from rapid.bench.contention import parse_schedule
from rapid.bench.md_table import md_table
from rapid.bench.presets import NET_PROFILES, SCHEDULES, apply_preset, net_profile
from rapid.bench.sim import ORACLE, ORACLE_LOAD, simulate
from rapid.runtime.policies import POLICIES

REFS = (ORACLE, ORACLE_LOAD)


def default_policies() -> list[str]:
    """Every runtime policy that drafts (``ar`` has no depth to choose): new ones appear here."""
    return [n for n, p in POLICIES.items() if p.drafting]


def cell_stats(policy, cal: Calibration, sched: str, prof: str, tokens: int, seeds: int) -> dict:
    """Means over seeds 0..seeds-1: tok/s, depth, accepted per round, ms per round, draft steps
    per round, kept branches per round."""
    rs = [simulate(policy, cal, parse_schedule(sched), net_profile(prof), tokens, s, startup=False)["edges"][0]
          for s in range(seeds)]

    def m(f) -> float:
        return statistics.fmean(f(r) for r in rs)

    return {"tok_s": m(lambda r: r.tok_s), "depth": m(lambda r: statistics.fmean(r.depths)),
            "accepted": m(lambda r: r.accepted / r.rounds), "ms_round": m(lambda r: 1000 * r.wall_s / r.rounds),
            "steps": m(lambda r: r.draft_steps / r.rounds), "kept": m(lambda r: r.hits / r.rounds)}


def run_presets(a, cal_of: dict[str, Calibration], out: Path) -> dict:
    """Simulate every (preset, RTT, schedule, prompt set) cell for the oracles and ``pols``."""
    pols = a.policies or default_policies()  # lists the command line parsed (bench.cli), None: the defaults
    profs = a.profiles or list(NET_PROFILES)
    scheds = a.contention or list(SCHEDULES)
    cells = []
    for preset in a.preset:  # the presets the command line parsed
        for st, base in sorted(cal_of.items()):
            c = apply_preset(base, preset)
            for prof in profs:
                for sched in scheds:
                    row = {"preset": preset.name, "profile": prof, "schedule": sched, "set": st, "stats": {}}
                    for name in (*REFS, *pols):
                        row["stats"][name] = cell_stats(name if name in REFS else POLICIES[name], c, sched, prof,
                                                        a.tokens, a.seeds)
                    cells.append(row)
    res = {"presets": [p.name for p in a.preset], "policies": pols, "profiles": profs,
           "schedules": scheds, "tokens": a.tokens, "seeds": a.seeds, "traces": [str(t) for t in a.traces],
           "cells": cells}
    out.mkdir(parents=True, exist_ok=True)
    (out / "presets.json").write_text(json.dumps(res, indent=2))
    (out / "presets.md").write_text(presets_md(res), encoding="utf-8")
    return res


def _frac(cells: list[dict], pol: str, ref: str) -> list[float]:
    return [c["stats"][pol]["tok_s"] / c["stats"][ref]["tok_s"] for c in cells if c["stats"][ref]["tok_s"] > 0]


def summary_rows(res: dict) -> list[dict]:
    """Per (preset, RTT): each policy's mean and worst fraction of ``oracle-load`` and of
    ``oracle`` over the prompt sets and schedules."""
    rows = []
    for preset in res["presets"]:
        for prof in res["profiles"]:
            cs = [c for c in res["cells"] if c["preset"] == preset and c["profile"] == prof]
            row = {"preset": preset, "profile": prof, "cells": len(cs),
                   "oracle_tok_s": statistics.fmean(c["stats"][ORACLE]["tok_s"] for c in cs),
                   "load_vs_oracle": statistics.fmean(_frac(cs, ORACLE_LOAD, ORACLE)), "pol": {}}
            for p in res["policies"]:
                fl, fo = _frac(cs, p, ORACLE_LOAD), _frac(cs, p, ORACLE)
                row["pol"][p] = {"load_mean": statistics.fmean(fl), "load_min": min(fl),
                                 "oracle_mean": statistics.fmean(fo), "oracle_min": min(fo)}
            rows.append(row)
    return rows


def presets_md(res: dict) -> str:
    pols = res["policies"]
    L = ["# rapid sim: the deployment regime", "",
         f"- presets {', '.join(res['presets'])}; RTT {', '.join(res['profiles'])}; contention "
         f"{', '.join(res['schedules'])}; {res['tokens']} tokens × {res['seeds']} seeds per cell, no start-up",
         f"- acceptance replayed per prompt set from {res['traces']}", "",
         "## Every policy against the oracles (mean over prompt sets × schedules; worst cell in brackets)", "",
         "Each policy cell: fraction of `oracle-load` (worst), then of `oracle`.", "",
         *md_table(["preset", "RTT", "oracle tok/s", "oracle-load / oracle", *pols],
                   ([r["preset"], r["profile"], f"{r['oracle_tok_s']:.3g}", f"{r['load_vs_oracle']:.2f}",
                     *(f"{v['load_mean']:.2f} ({v['load_min']:.2f}); {v['oracle_mean']:.2f}"
                       for v in (r["pol"][p] for p in pols))] for r in summary_rows(res)))]
    L += ["", "## Where the time goes (mean over prompt sets, per schedule)", "",
          "Per reference / policy: tok/s, mean depth, accepted per round, ms per round, kept branches per round.", ""]
    names = [*REFS, *pols]
    rows = []
    for preset in res["presets"]:
        for prof in res["profiles"]:
            for sched in res["schedules"]:
                cs = [c for c in res["cells"] if (c["preset"], c["profile"], c["schedule"]) == (preset, prof, sched)]

                def f(n: str, k: str, cs=cs) -> float:
                    return statistics.fmean(c["stats"][n][k] for c in cs)

                rows.append([preset, prof, sched, *(f"{f(n, 'tok_s'):.3g}; d {f(n, 'depth'):.1f}; a "
                                                    f"{f(n, 'accepted'):.2f}; {f(n, 'ms_round'):.0f} ms; k {f(n, 'kept'):.2f}"
                                                    for n in names)])
    L += md_table(["preset", "RTT", "schedule", *names], rows)
    L += ["", "## Every cell (tok/s; policies as a fraction of oracle-load)", ""]
    rows = []
    for c in res["cells"]:
        s = c["stats"]
        ol = s[ORACLE_LOAD]["tok_s"]
        rows.append([c["preset"], c["profile"], c["schedule"], c["set"], f"{s[ORACLE]['tok_s']:.3g}", f"{ol:.3g}",
                     *(f"{s[p]['tok_s'] / ol:.2f}" for p in pols)])
    L += md_table(["preset", "RTT", "schedule", "set", "oracle", "oracle-load", *pols], rows)
    return "\n".join(L) + "\n"
