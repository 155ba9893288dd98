"""PNG plots of a bench folder (matplotlib, Agg backend)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from rapid.bench.contention import Schedule
from rapid.bench.policy_targets import ablation


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _schedule_of(meta: dict, name: str):
    d = meta.get("schedules", {}).get(name)
    return Schedule(**d) if d else None


def _pick_run(rounds: list[dict]) -> tuple[tuple, dict[str, list[dict]]]:
    """The first (profile, schedule, set, prompt, repeat 0) cell, preferring a contended schedule."""
    cells: dict[tuple, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in rounds:
        if r.get("repeat", 0) == 0:
            cells[(r["profile"], r["schedule"], r["set"], r["prompt_id"])][r["policy"]].append(r)
    if not cells:
        return (), {}
    keys = sorted(cells, key=lambda k: (k[1] == "none", k))
    return keys[0], cells[keys[0]]


def make_plots(folder: Path, rows: list[dict], rounds: list[dict], meta: dict) -> dict[str, Path]:
    """{name: png} for the plots this run has data for: throughput, ablation, controller, timeline."""
    plt = _plt()
    out: dict[str, Path] = {}

    def save(name: str, fig) -> None:
        fig.tight_layout()
        out[name] = folder / f"{name}.png"
        fig.savefig(out[name], dpi=90)
        plt.close(fig)

    panels = sorted({(r["profile"], r["schedule"]) for r in rows})
    if panels:
        save("throughput", _throughput(plt, rows, panels))
    abl = ablation(rows)
    if abl:
        save("ablation", _ablation(plt, abl))
    key, by_policy = _pick_run(rounds)
    if by_policy:
        sched = _schedule_of(meta, key[1])
        horizon = max(r["t_rel_end"] for rs in by_policy.values() for r in rs)
        save("controller", _controller(plt, by_policy, key, sched, horizon))
        save("timeline", _timeline(plt, by_policy, sched, horizon))
    return out


def _throughput(plt, rows: list[dict], panels: list[tuple[str, str]]):
    """1. throughput by policy and prompt set (one panel per profile × schedule)."""
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.6), squeeze=False)
    for ax, (prof, sched) in zip(axes[0], panels, strict=True):
        sub = [r for r in rows if r["profile"] == prof and r["schedule"] == sched]
        sets = sorted({r["set"] for r in sub})
        pols = sorted({r["policy"] for r in sub})
        w = 0.8 / max(len(pols), 1)
        for j, pol in enumerate(pols):
            xs, ys, lo, hi = [], [], [], []
            for i, s in enumerate(sets):
                r = next((r for r in sub if r["set"] == s and r["policy"] == pol), None)
                if r:
                    xs.append(i + j * w)
                    ys.append(r["tok_s"])
                    lo.append(r["tok_s"] - r["tok_s_min"])
                    hi.append(r["tok_s_max"] - r["tok_s"])
            ax.bar(xs, ys, w, yerr=[lo, hi], capsize=3, label=pol)
        ax.set_xticks([i + w * (len(pols) - 1) / 2 for i in range(len(sets))], sets)
        ax.set_title(f"{prof} / {sched}", fontsize=9)
        ax.set_ylabel("tok/s (median, min–max)")
    axes[0][0].legend(fontsize=8)
    return fig


def _ablation(plt, abl: list[dict]):
    """4. the ablation: each mechanism's macro-mean gain over fixed, sustained contention."""
    profs = sorted({a["profile"] for a in abl})
    fig, axes = plt.subplots(1, len(profs), figsize=(5.5 * len(profs), 3.4), squeeze=False)
    for ax, prof in zip(axes[0], profs, strict=True):
        sub = [a for a in abl if a["profile"] == prof]
        ax.bar([a["label"] for a in sub], [a["gain"] for a in sub], color="tab:green")
        ax.axhline(1.0, color="gray", lw=0.8)
        for i, a in enumerate(sub):
            ax.text(i, a["gain"], f"{a['gain']:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("tok/s vs fixed (macro mean over sets)")
        ax.set_title(f"ablation, sustained contention, {prof}", fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    return fig


def _controller(plt, by_policy: dict, key, sched, horizon: float):
    """2. depth, ESR and eta over time, contention shaded."""
    fig, axes = plt.subplots(3, 1, figsize=(8, 6.5), sharex=True)
    for pol, rs in sorted(by_policy.items()):
        t = [r["t_rel_start"] for r in rs]
        axes[0].step(t, [r["depth"] for r in rs], where="post", label=pol)
        axes[1].plot(t, [r["esr"] for r in rs], marker=".", label=pol)
        axes[2].plot(t, [r["eta"] for r in rs], marker=".", label=pol)
    for ax, name in zip(axes, ("depth", "ESR", "η"), strict=True):
        ax.set_ylabel(name)
        if sched is not None:
            for a, b in sched.periods(horizon):
                ax.axvspan(a, b, color="red", alpha=0.12, lw=0)
    axes[0].legend(fontsize=8)
    axes[0].set_title(f"{' / '.join(map(str, key))} — shaded: contention period", fontsize=9)
    axes[2].set_xlabel("seconds since generation start")
    return fig


def _timeline(plt, by_policy: dict, sched, horizon: float):
    """3. round timeline: drafting, waiting (proactive expansion inside), interrupts."""
    pols = sorted(by_policy)
    fig, ax = plt.subplots(figsize=(9, 0.7 * len(pols) + 1.5))
    for y, pol in enumerate(pols):
        for r in by_policy[pol]:
            t0 = r["t_rel_start"]
            ax.broken_barh([(t0, r["draft_s"])], (y - 0.35, 0.7), color="tab:blue")
            ax.broken_barh([(t0 + r["draft_s"], r["wait_s"])], (y - 0.35, 0.7), color="tab:orange")
            if r.get("interrupted_at") is not None:
                ax.plot([t0 + r["draft_s"] + r["wait_s"]], [y + 0.45], "v", color="black", ms=5)
    if sched is not None:
        for a, b in sched.periods(horizon):
            ax.axvspan(a, b, color="red", alpha=0.1, lw=0)
    ax.set_yticks(range(len(pols)), pols)
    ax.set_xlabel("seconds since generation start")
    ax.set_title("round timeline: blue drafting, orange waiting for the verdict, ▼ interrupt", fontsize=9)
    return fig
