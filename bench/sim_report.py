"""``rapid sim``'s command: calibrate from bench traces, validate, compare with the oracle,
study many edges, and write ``sim.md`` / ``sim.json`` / ``scale.png`` (the model is ``bench.sim``)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

from rapid.bench.calibration import calibrate, fit_cloud, fit_prompt_set
from rapid.bench.contention import Schedule, parse_schedule
from rapid.bench.md_table import md_table
from rapid.bench.netem import get_profile
from rapid.bench.plots import _plt
from rapid.bench.preset_report import default_policies, run_presets
from rapid.bench.report import aggregate
from rapid.bench.sim import ORACLE, ORACLE_LOAD, sim_tok_s, simulate
from rapid.bench.traces import TraceError, load_traces, make_output_folder, shared_run
from rapid.core.errors import OptionError
from rapid.runtime.policies import POLICIES


def run_sim_cli(a) -> int:
    per_run = [read_traced_folder(t) for t in a.traces]  # (name, rounds, runs, meta), read once
    rounds = [r for _, rs, _, _ in per_run for r in rs]
    runs = [r for _, _, us, _ in per_run for r in us]
    meta = next((m for *_, m in per_run if m), {})
    warmup = [r for *_, m in per_run for r in m.get("warmup_rounds", [])]  # every folder's warm-up
    meta = {**meta, "warmup_rounds": warmup} if warmup else meta
    out = make_output_folder(Path(a.out or Path(a.traces[0]) / "sim"))
    cal = calibrate(rounds, runs, meta, a.gpu_profile)
    traced_pols = sorted({r["policy"] for r in runs})
    # the lists of names the command line parsed (bench.cli), else the traced ones
    pols = a.policies or sorted(
        {p for p in traced_pols if p in POLICIES and POLICIES[p].drafting} | set(default_policies()))
    scheds = a.contention or sorted({r["schedule"] for r in runs})
    profs = a.profiles or sorted({r["profile"] for r in runs})
    # every folder's schedules (the first meta alone lacks the others')
    sched_of = {n: Schedule(**d) for *_, m in per_run for n, d in m.get("schedules", {}).items()}

    def sch(n):
        return sched_of.get(n) or parse_schedule(n)

    # acceptance and prompt length differ by prompt set: each set replays its own traces
    # (acceptance, start-up, draft prefill); the device/network timing model is shared
    sets = sorted({str(r.get("set")) for r in runs})
    cal_of = {st: fit_prompt_set(replace(cal), [r for r in rounds if str(r.get("set")) == st],
                                 [r for r in runs if str(r.get("set")) == st]) for st in sets}
    if getattr(a, "preset", None):  # the deployment regime: the presets' timing, the traces' acceptance
        run_presets(a, cal_of, out)
        print((out / "presets.md").read_text())
        return 0
    val = _validation(per_run, cal, sch, a.seeds)
    cells = _policy_cells(cal_of, profs, scheds, sets, pols, sch, a)
    scale = _scale(cal, pols, profs, scheds, sch, a)
    result = {"calibration": cal.to_json(), "validation": val, "policies": cells, "scale": scale,
              "cloud_elsewhere": a.cloud_elsewhere,
              "tokens": a.tokens, "seeds": a.seeds, "traces": [str(t) for t in a.traces]}
    (out / "sim.json").write_text(json.dumps(result, indent=2))
    _write_sim_md(out, result)
    _plot_scale(out, scale)
    print((out / "sim.md").read_text())
    return 0


def check_traced_folder(folder: str | Path) -> Path:
    """A ``--traces`` folder holding ``runs.jsonl`` and ``rounds.jsonl`` (a ``rapid bench``
    output), else ``OptionError``."""
    f = Path(folder)
    if not f.is_dir():
        raise OptionError(f"--traces {f}: no such folder")
    for name in ("runs.jsonl", "rounds.jsonl"):
        if not (f / name).is_file():
            raise OptionError(f"--traces {f}: no {name} file there (not a rapid bench output folder)")
    return f


def read_traced_folder(folder: str | Path) -> tuple[str, list[dict], list[dict], dict]:
    """One ``--traces`` folder: (name, rounds, runs, meta); ``TraceError`` (rapid.bench.traces)
    where a record is malformed or there are no runs or no rounds."""
    f = check_traced_folder(folder)
    rounds, runs, meta = load_traces([f])
    for name, records in (("runs", runs), ("rounds", rounds)):
        if not records:
            raise TraceError(f"no {name} in {f / (name + '.jsonl')}: nothing to calibrate from")
    shared = shared_run(rounds)
    if shared is not None:
        raise TraceError(f"{f / 'rounds.jsonl'}: two generations share the key {shared[1:]} (profile, schedule, "
                         "set, prompt, repeat, policy): a list named one thing twice; the replay cannot part them")
    for r in rounds + runs:  # pooled with other folders: each generation stays its own (traces.run_key)
        r["trace"] = str(f)
    return f.name, rounds, runs, meta


def _validation(per_run: list, cal, sch, seeds: int) -> list[dict]:
    """1. validation on the settings that were run for real, one traced folder at a time, at its
    own tokens per generation: the edge model is pooled over all folders (a folder may lack
    uncontended rounds), the cloud's verify curve is the folder's own (the machine's speed
    drifts between runs: the 8-node verify median moved by ~10 % between runs here)."""
    val = []
    for name, f_rounds, f_runs, f_meta in per_run:
        f_cal = fit_cloud(replace(cal), f_rounds, f_meta.get("profiles", {})) if len(per_run) > 1 else cal
        max_new = int(f_meta.get("config", {}).get("max_new", 24))
        f_cal_of = {st: fit_prompt_set(replace(f_cal), [x for x in f_rounds if str(x.get("set")) == st],
                                       [x for x in f_runs if str(x.get("set")) == st])
                    for st in {str(x.get("set")) for x in f_runs}}
        order = [x for x in f_meta.get("config", {}).get("sets", []) if x in f_cal_of] or sorted(f_cal_of)
        for r in aggregate(f_runs):
            if r["policy"] not in POLICIES:
                continue
            st = str(r["set"])
            m = r["tok_s"]
            before = order[order.index(st) - 1] if st in order else st  # the bench's previous generation
            s = sim_tok_s(POLICIES[r["policy"]], f_cal_of[st], sch(r["schedule"]), get_profile(r["profile"]),
                          max_new, max(seeds, 20), previous=f_cal_of[before])
            val.append({"run": name, "tokens": max_new, "profile": r["profile"], "schedule": r["schedule"],
                        "set": st, "policy": r["policy"], "measured_tok_s": m, "sim_tok_s": s,
                        "error": (s - m) / m if m else float("nan")})
    return val


def _policy_cells(cal_of: dict, profs: list[str], scheds: list[str], sets: list[str], pols: list[str], sch,
                  a) -> list[dict]:
    """2. policies vs the oracle (long generations, no start-up), per prompt set; with
    ``--cloud-elsewhere`` the cloud on its own machine (no co-location tax)."""
    cells = []
    on_host = not a.cloud_elsewhere
    for prof in profs:
        for sname in scheds:
            for st in sets:
                c = cal_of[st]
                orc = sim_tok_s(ORACLE, c, sch(sname), get_profile(prof), a.tokens, a.seeds, startup=False, colocated=on_host)
                row = {"profile": prof, "schedule": sname, "set": st, "oracle_tok_s": orc,
                       "load_oracle_tok_s": sim_tok_s(ORACLE_LOAD, c, sch(sname), get_profile(prof), a.tokens,
                                                      a.seeds, startup=False, colocated=on_host), "tok_s": {}}
                for pol in pols:
                    row["tok_s"][pol] = sim_tok_s(POLICIES[pol], c, sch(sname), get_profile(prof), a.tokens,
                                                  a.seeds, startup=False, colocated=on_host)
                cells.append(row)
    return cells


def _scale(cal, pols: list[str], profs: list[str], scheds: list[str], sch, a) -> list[dict]:
    """3. many edges, batched verifier replicas."""
    scale = []
    sname = next((s for s in scheds if s != "none"), scheds[0])
    for pol in [p for p in ("fixed", "rapid") if p in pols] or pols[:2]:
        for k in a.replicas:  # counts, parsed once by the command line (bench.cli)
            for n in a.edges:
                hop = a.ingress_ms / 1000 if k > 1 else 0.0
                r = simulate(POLICIES[pol], cal, sch(sname), get_profile(profs[0]), min(a.tokens, 64), 0, edges=n,
                             max_batch=a.max_batch, startup=False, replicas=k, ingress_s=hop)
                tps = [e.tok_s for e in r["edges"]]
                scale.append({"policy": pol, "edges": n, "replicas": k, "schedule": sname,
                              "tok_s_per_edge": statistics.fmean(tps), "total_tok_s": sum(tps),
                              "cloud_util": r["cloud_util"], "mean_batch": r["mean_batch"]})
    return scale


def _write_sim_md(out: Path, res: dict) -> None:
    L = [*_calibration_lines(res),
         "", "## Validation: simulated vs measured throughput (same settings, same tokens per generation)", "",
         "Each prompt set replays its own traces for what depends on the prompt (acceptance, start-up, draft "
         "prefill); the device and network timing model is shared.", "",
         *md_table(["run", "tokens", "profile", "schedule", "set", "policy", "measured tok/s", "simulated tok/s",
                    "error"],
                   ([v["run"], v["tokens"], v["profile"], v["schedule"], v["set"], v["policy"],
                     f"{v['measured_tok_s']:.3g}", f"{v['sim_tok_s']:.3g}", f"{v['error']:+.1%}"]
                    for v in res["validation"]))]
    errs = [abs(v["error"]) for v in res["validation"] if not math.isnan(v["error"])]
    if errs:
        L.append(f"\nmean |error| {statistics.fmean(errs):.1%}, max {max(errs):.1%} (target ≤ 15 %)")
    L += _policy_lines(res)
    L += ["", "## Many edges, batched verifier replicas (batch time = verify(total nodes); edges spread "
          "evenly over the replicas)", "",
          *md_table(["policy", "schedule", "replicas", "edges", "tok/s per edge", "total tok/s", "cloud utilisation",
                     "mean batch"],
                    ([r["policy"], r["schedule"], r.get("replicas", 1), r["edges"], f"{r['tok_s_per_edge']:.3g}",
                      f"{r['total_tok_s']:.3g}", f"{r['cloud_util']:.0%}", f"{r['mean_batch']:.1f}"]
                     for r in res["scale"]))]
    L += ["", "![scale](scale.png)", ""]
    (out / "sim.md").write_text("\n".join(L), encoding="utf-8")


def _calibration_lines(res: dict) -> list[str]:
    c = res["calibration"]
    return ["# rapid sim report", "",
         f"- calibrated from {res['traces']}" + (" + GPU profile" if c.get("gpu_profile") else ""),
         f"- edge step (uncontended median) {c['step_s_median']:.4g} s over {c['step_samples']} "
         f"{c.get('step_reference', 'rounds')}; contention "
         f"slowdown ×{c['slowdown']:.2f} at intensity {c['cal_intensity']:g}"
         + (" (per traced schedule: " + ", ".join(f"{k} ×{v:.2f}" for k, v in c["slowdown_by_schedule"].items())
            + ")" if c.get("slowdown_by_schedule") else "")
         + "".join(f"; {k} out of its load ×{v:.2f}" for k, v in c.get("idle_slowdown_by_schedule", {}).items()),
         *_tax_lines(c),
         f"- verify(nodes) = {c['verify_a']:.4g} + {c['verify_b']:.4g}·nodes s (least squares)"
         + (", used as the medians at " + ", ".join(f"{int(x)}: {y:.3g} s" for x, y in zip(*c["verify_table"],
                                                                                            strict=True))
            + " nodes, interpolated" if c.get("verify_table") and not c.get("gpu_profile") else "")
         + f"; transport overhead "
         f"{c['overhead_s'] * 1000:.1f} ms/round; start-up {c['startup_s']:.2f} s/generation",
         f"- acceptance replay: {c['match_bits']} positions, per-token acceptance {c['p_accept']:.2f}; proactive hit "
         f"rate {c['p_hit_full']:.2f} (fully accepted) / {c['p_hit_part']:.2f} (partly)",
         f"- draft prefill in the first round {c['prefill_s']:.2f} s (uncontended); controller "
         + ("carried and warmed up uncontended, as traced" if c.get("warm_controller") else "fresh per generation"),
         "- EdgeLLM confidence cut: " + (f"P(continue | miss) {c['cut_continue'][0]:.2f}, P(continue | match) "
                                          f"{c['cut_continue'][1]:.2f}" if c.get("cut_continue") else
                                          "not traced (edgellm then drafts to its planned depth)"),
         "- policies: the runtime's `POLICIES` objects and the controller `Coordinator` builds (CAAC/FixedDepth)"]


def _tax_lines(c: dict) -> list[str]:
    """The co-location tax the one-edge cells pay (rapid.bench.colocation), if fitted."""
    by = c.get("verify_by_schedule") or {}
    if not by and not c.get("step_tax"):
        return []
    phases = ", ".join(f"{k} ×{on:.2f} in its load" + (f", ×{off:.2f} out of it" if off != 1.0 else "")
                       for k, (on, off) in by.items())
    loaded = 1 + c.get("load_tax", 0.0)
    return [f"- co-location tax (one edge beside its cloud on this host, as the bench ran; none for many edges): "
            f"the verify {phases or f'×{loaded:.2f} in a load'}; "
            f"+{c.get('step_tax', 0.0):.3f} s per s of edge step beside an unloaded verify"]


def _policy_lines(res: dict) -> list[str]:
    pols = sorted({p for r in res["policies"] for p in r["tok_s"]})
    where = ", the cloud on its own machine: no co-location tax" if res.get("cloud_elsewhere") else ""
    L = ["", f"## Policies vs the oracle ({res['tokens']} tokens, {res['seeds']} seeds, no start-up{where})", "",
          "`oracle` knows the future acceptance, proactive hits and contention; `oracle-load` knows only the "
          "contention (depth = argmax of expected tokens per second under the traced per-token acceptance). "
          "Policy columns: fraction of `oracle` (and of `oracle-load`).", ""]
    rows = []
    for r in res["policies"]:
        o, ol = r["oracle_tok_s"], r["load_oracle_tok_s"]
        cells = [f"{r['tok_s'][p] / o:.0%} ({r['tok_s'][p] / ol:.0%})" if o and ol else "–" for p in pols]
        rows.append([r["profile"], r["schedule"], r["set"], f"{o:.3g}", f"{ol:.3g} ({ol / o:.0%})", *cells])
    L += md_table(["profile", "schedule", "set", "oracle tok/s", "oracle-load", *pols], rows)
    fr = [(r, r["tok_s"]["rapid"] / r["oracle_tok_s"]) for r in res["policies"]
          if "rapid" in r["tok_s"] and r["oracle_tok_s"]]
    if fr:
        worst = min(f for _, f in fr)
        L.append(f"\nTarget rapid ≥ 0.9 × oracle: rapid reaches {worst:.0%}–{max(f for _, f in fr):.0%} of the oracle; "
                 + ("met" if worst >= 0.9 else f"missed in {sum(f < 0.9 for _, f in fr)}/{len(fr)} cells, by up to "
                    f"{(0.9 - worst) / 0.9:.0%}") + ".")
    return L


def _plot_scale(out: Path, scale: list[dict]) -> None:
    if not scale:
        return
    plt = _plt()
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5))
    for pol, k in sorted({(r["policy"], r.get("replicas", 1)) for r in scale}):
        rs = [r for r in scale if r["policy"] == pol and r.get("replicas", 1) == k]
        label = pol if k == 1 else f"{pol} ×{k} replicas"
        ax[0].plot([r["edges"] for r in rs], [r["tok_s_per_edge"] for r in rs], marker="o", label=label)
        ax[1].plot([r["edges"] for r in rs], [r["cloud_util"] for r in rs], marker="o", label=label)
    for x, yl in zip(ax, ("tok/s per edge", "cloud utilisation"), strict=True):
        x.set_xscale("log", base=2)
        x.set_xlabel("edges")
        x.set_ylabel(yl)
        x.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "scale.png", dpi=90)
    plt.close(fig)
