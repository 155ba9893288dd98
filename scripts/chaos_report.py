"""The chaos soak's report: figures from the run records, the pass checks, a markdown summary."""

from __future__ import annotations

from collections import Counter

OUTCOMES = ("identical", "mismatch", "clean_error", "unclean_error", "killed", "hang")


def summarize(runs: list[dict], faults: Counter, proxy_events: Counter, rogue: list[dict],
              incarnations: list[dict], rss: list[list], leak: dict) -> dict:
    outcomes = Counter(r["outcome"] for r in runs)
    finished = outcomes["identical"] + outcomes["mismatch"]
    policies: dict[str, Counter] = {}
    for r in runs:
        policies.setdefault(r["policy"], Counter())[r["outcome"]] += 1
    return {
        "runs": len(runs),
        "outcomes": {k: outcomes[k] for k in OUTCOMES},
        "finished": finished,
        "identical_of_finished": f"{outcomes['identical']}/{finished}",
        "clean_errors": dict(Counter(r["detail"] for r in runs if r["outcome"] == "clean_error")),
        "unclean_errors": [_brief(r) for r in runs if r["outcome"] == "unclean_error"][:20],
        "mismatches": [_brief(r) for r in runs if r["outcome"] == "mismatch"][:20],
        "hangs": [_brief(r) for r in runs if r["outcome"] == "hang"][:20],
        "runs_that_reconnected": sum(1 for r in runs if r["reconnects"]),
        "edge_reconnects": sum(r["reconnects"] for r in runs),
        "faults": dict(faults),
        "proxy_events": dict(proxy_events),
        "rogue": {"by_case": dict(Counter(x["case"] for x in rogue)),
                  "outcomes": dict(Counter(x["outcome"] for x in rogue)),
                  "anomalies": [x for x in rogue if x["outcome"] == "anomaly"][:20]},
        "per_policy": {p: dict(c) for p, c in sorted(policies.items())},
        "leak": leak,
        "cloud": [_incarnation(c, rss) for c in incarnations],
        "rss_mb": _rss_range([s[2] for s in rss]),
    }


def _brief(r: dict) -> dict:
    return {k: r[k] for k in ("index", "policy", "draft", "route", "job", "wall_s", "detail")}


def _rss_range(kb: list[int]) -> dict:
    mb = [k / 1024 for k in kb if k]
    if not mb:
        return {}
    return {"first": round(mb[0], 1), "max": round(max(mb), 1), "last": round(mb[-1], 1), "samples": len(mb)}


def _incarnation(c: dict, rss: list[list]) -> dict:
    return {**c, "rss_mb": _rss_range([s[2] for s in rss if s[1] == c["n"]])}


def failures(s: dict) -> list[str]:
    """The soak's pass checks; an empty list passes."""
    o = s["outcomes"]
    out = []
    if o["hang"]:
        out.append(f"{o['hang']} run(s) hung")
    if o["mismatch"]:
        out.append(f"{o['mismatch']} finished run(s) differ from target-only decoding")
    if o["unclean_error"]:
        out.append(f"{o['unclean_error']} run(s) failed without a clean one-line error")
    if not o["identical"]:
        out.append("no run finished: nothing was checked")
    if s["leak"].get("sessions_active") != 0:
        out.append(f"leaked sessions: rapid_sessions_active = {s['leak'].get('sessions_active')} after the grace period")
    if s["rogue"]["anomalies"]:
        which = "; ".join(f"{x['case']} at {x.get('at_s')} s wanted {x.get('want')}, got {x.get('got')}"
                          for x in s["rogue"]["anomalies"])
        out.append(f"{len(s['rogue']['anomalies'])} rogue frame(s) got a wrong or no answer ({which})")
    return out


def markdown(s: dict, config: dict) -> str:
    o, leak = s["outcomes"], s["leak"]
    inj = ", ".join(f"{k} {v}" for k, v in sorted(s["faults"].items())) or "none"
    prox = ", ".join(f"{k} {v}" for k, v in sorted(s["proxy_events"].items())) or "none"
    errs = ", ".join(f"{k} {v}" for k, v in sorted(s["clean_errors"].items())) or "none"
    rogue = ", ".join(f"{k} {v}" for k, v in sorted(s["rogue"]["outcomes"].items())) or "none"
    rss = s["rss_mb"]
    rows = [
        ("runs (edge processes)", s["runs"]),
        ("finished, identical to target-only", s["identical_of_finished"]),
        ("clean errors (typed, one line)", f"{o['clean_error']} ({errs})"),
        ("unclean errors", o["unclean_error"]),
        ("killed by the soak (edge kills)", o["killed"]),
        ("hangs (bound {:.0f} s)".format(config["run_timeout"]), o["hang"]),
        ("runs that reconnected / reconnects", f"{s['runs_that_reconnected']} / {s['edge_reconnects']}"),
        ("faults injected", inj),
        ("proxy message faults", prox),
        ("rogue cases", rogue),
        ("leaked sessions (after {:.0f} s grace)".format(config["grace"]),
         f"{leak.get('sessions_active')} (before the grace: {leak.get('sessions_before_grace')})"),
        ("cloud incarnations (kill -9 + restart)", len(s["cloud"])),
        ("cloud RSS MB first / max / last", f"{rss.get('first')} / {rss.get('max')} / {rss.get('last')}"),
    ]
    lines = ["| figure | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows), "",
             "| policy | " + " | ".join(OUTCOMES) + " |", "|---|" + "---|" * len(OUTCOMES)]
    for p, c in s["per_policy"].items():
        lines.append(f"| {p} | " + " | ".join(str(c.get(k, 0)) for k in OUTCOMES) + " |")
    return "\n".join(lines)
