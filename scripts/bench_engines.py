#!/usr/bin/env python
"""Per-step latency of the draft backends: PyTorch vs ONNX Runtime (staged and window KV binding).

For T = 1, 4, 8, 16 new tokens at P = 128 and 1024 cached entries, on the tiny random draft and,
when ``rapid.models.resolve_model("default-draft")`` resolves, on the real default draft
(Qwen2.5-Coder-0.5B), exported once into ``--export-dir`` (default /tmp/rapid-export-draft,
outside the repo; reused when its manifest names the same weights).

Both backends run single-threaded (``torch.set_num_threads(1)``, ORT ``intra_op_num_threads=1``);
each cell is the median of ``--reps`` timed steps (after warm-up), engines interleaved round-robin
so machine noise hits them alike. Each timed step is ``step(T tokens) → logits()`` followed by an
(untimed) ``truncate(P)``. The KV cache is filled with random values up to P (latency does not
depend on the values), so no slow single-thread prefill is needed.

Also timed at P = 1024: the boundary restore (``truncate``) and the compaction of an 8-node path
out of a 16-node tree step, next to a T = 8 tree step.

    python scripts/bench_engines.py                 # tiny + default draft (if fetched)
    python scripts/bench_engines.py --tiny-only --reps 30
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

TS = (1, 4, 8, 16)
PS = (128, 1024)
CAPACITY = 2048


def _fill_kv(engine, p: int, rng: np.random.Generator) -> None:
    """Pretend ``p`` entries are cached (random values; timing does not depend on them)."""
    if engine.info.backend == "torch":
        engine.kv.k.normal_(0.0, 1.0)
        engine.kv.v.normal_(0.0, 1.0)
        engine.kv.length = p
    else:
        k, v = engine.kv_arrays()
        k[...] = rng.standard_normal(k.shape, dtype=np.float32).astype(k.dtype)
        v[...] = rng.standard_normal(v.shape, dtype=np.float32).astype(v.dtype)
        engine.truncate(0)
        engine._len = p  # noqa: SLF001 - benchmark-only shortcut (no prefill)


def _step_args(p: int, t: int, vocab: int, rng: np.random.Generator):
    from rapid.core.geometry import causal_allowed

    return rng.integers(0, vocab, t), np.arange(p, p + t), causal_allowed(p, t)


def bench_steps(engines: dict[str, object], reps: int, warmup: int, ps=PS, ts=TS) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for p in ps:
        for e in engines.values():
            _fill_kv(e, p, rng)
        for t in ts:
            times: dict[str, list[float]] = {name: [] for name in engines}
            args = _step_args(p, t, next(iter(engines.values())).info.vocab_size, rng)
            for r in range(warmup + reps):
                for name, e in engines.items():
                    t0 = time.perf_counter()
                    e.step(*args).logits()
                    dt = time.perf_counter() - t0
                    e.truncate(p)
                    if r >= warmup:
                        times[name].append(dt)
            row = {"P": p, "T": t, **{name: statistics.median(v) * 1e3 for name, v in times.items()}}
            # ratios within one round (same machine load for both), then the median over rounds
            for name in engines:
                if name != "torch" and "torch" in times:
                    row[f"torch/{name}"] = statistics.median(a / b for a, b in zip(times["torch"], times[name],
                                                                                   strict=True))
            rows.append(row)
            print(f"  P={p:<5d} T={t:<3d} " + "  ".join(f"{n} {row[n]:8.2f} ms" for n in engines)
                  + f"  torch/onnx {row.get('torch/onnx', float('nan')):.2f}x", flush=True)
    return rows


def bench_kv_ops(engines: dict[str, object], reps: int, p: int = 1024) -> list[dict]:
    """truncate (boundary restore) and compaction of an 8-node path vs a T=8 tree step."""
    from rapid.export.parity import tree_allowed

    rng = np.random.default_rng(1)
    out = []
    # a 16-node tree: two chains of 8 (0-2-4-…-14 and 1-3-…-15), keep the first chain
    parents = [-1, -1] + list(range(14))
    allowed16, depth16 = tree_allowed(parents, p)
    path = [p + i for i in range(0, 16, 2)]
    allowed8, depth8 = tree_allowed([-1, 0, 0, 1, 1, 2, 2, 3], p)
    for name, e in engines.items():
        _fill_kv(e, p, rng)
        trunc, comp, step8 = [], [], []
        for _ in range(reps):
            toks = rng.integers(0, e.info.vocab_size, 16)
            t0 = time.perf_counter()
            e.step(toks[:8], p + depth8, allowed8).logits()
            step8.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            e.truncate(p)  # boundary restore
            trunc.append(time.perf_counter() - t0)
            e.step(toks, p + depth16, allowed16).logits()
            t0 = time.perf_counter()
            e.compact(path, p)  # keep the accepted 8-node path
            comp.append(time.perf_counter() - t0)
            e.truncate(p)
        row = {"engine": name, "P": p, "truncate_us": statistics.median(trunc) * 1e6,
               "compact8_us": statistics.median(comp) * 1e6, "tree_step8_ms": statistics.median(step8) * 1e3}
        out.append(row)
        print(f"  {name}: truncate {row['truncate_us']:.1f} us, compact 8-node path {row['compact8_us']:.1f} us, "
              f"T=8 tree step {row['tree_step8_ms']:.2f} ms", flush=True)
    return out


def open_engines(model: str, export_dir: Path, threads: int) -> dict[str, object]:
    import torch

    from rapid.engines.ort_engine import OrtEngine
    from rapid.engines.select import open_engine

    torch.set_num_threads(threads)
    engines: dict[str, object] = {"torch": open_engine("torch", model, CAPACITY, threads=threads)}
    staged = OrtEngine(export_dir, CAPACITY, threads=threads, kv_binding="staged")
    engines["onnx"] = staged
    # same ORT session (one copy of the weights), the other binding design
    engines["onnx-window"] = OrtEngine(export_dir, CAPACITY, kv_binding="window", session=staged.session)
    return engines


def ensure_export(model: str, export_dir: Path, force: bool) -> dict:
    """Export ``model`` into ``export_dir`` unless an export of the same weights is there."""
    from rapid.core.manifest import is_export_dir, load_manifest
    from rapid.export.onnx_export import export_onnx
    from rapid.models import resolve_model

    resolved = resolve_model(model)
    if not force and is_export_dir(export_dir):
        m = load_manifest(export_dir)
        if m["model"].get("resolved") == resolved and m["max_context"] >= CAPACITY:
            print(f"reusing the export in {export_dir} (made {m['created']})", flush=True)
            return m
    print(f"exporting {model} ({resolved}) to {export_dir} …", flush=True)
    return export_onnx(model, export_dir, max_context=CAPACITY, max_tree=64, progress=True)


def markdown(title: str, rows: list[dict]) -> str:
    lines = [f"### {title}", "",
             "| P | T | torch ms | onnx staged ms | onnx window ms | torch/onnx staged | torch/onnx window |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['P']} | {r['T']} | {r['torch']:.2f} | {r['onnx']:.2f} | {r['onnx-window']:.2f} | "
                     f"{r['torch/onnx']:.2f}x | {r['torch/onnx-window']:.2f}x |")
    lines += ["", "(ratios: median over rounds of the per-round ratio; > 1 means ONNX is faster)"]
    return "\n".join(lines)


def markdown_kv(title: str, rows: list[dict]) -> str:
    lines = [f"### {title}", "", "| engine | P | truncate (restore) µs | compact 8-node path µs | T=8 tree step ms |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['engine']} | {r['P']} | {r['truncate_us']:.1f} | {r['compact8_us']:.1f} | "
                     f"{r['tree_step8_ms']:.2f} |")
    return "\n".join(lines)


def run_model(label: str, model: str, export_dir: Path, args, reps: int) -> dict:
    print(f"\n== {label}: {model}", flush=True)
    engines = open_engines(model, export_dir, args.threads)
    print(f"  onnx provider: {engines['onnx'].info.device}", flush=True)
    steps = bench_steps(engines, reps, args.warmup)
    kv = bench_kv_ops(engines, reps)
    del engines
    return {"label": label, "model": model, "steps": steps, "kv_ops": kv}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draft", default="default-draft", help="the real draft model spec")
    ap.add_argument("--export-dir", default="/tmp/rapid-export-draft", type=Path)
    ap.add_argument("--tiny-only", action="store_true")
    ap.add_argument("--force-export", action="store_true")
    ap.add_argument("--reps", type=int, default=30, help="timed steps per cell (tiny)")
    ap.add_argument("--real-reps", type=int, default=9, help="timed steps per cell (real draft)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    from rapid.core.errors import RapidError
    from rapid.export.onnx_export import export_onnx
    from rapid.tiny import build_tiny

    results: dict = {"threads": args.threads, "capacity": CAPACITY, "models": []}
    with tempfile.TemporaryDirectory(prefix="rapid-bench-") as tmp:
        tiny = build_tiny(Path(tmp) / "tiny", "qwen2", seed=0)
        t0 = time.perf_counter()
        export_onnx(str(tiny), Path(tmp) / "tiny-export", max_context=CAPACITY, max_tree=64, progress=False)
        print(f"tiny export: {time.perf_counter() - t0:.1f} s", flush=True)
        results["models"].append(run_model("tiny draft (qwen2, hidden 64, 2 layers)", str(tiny),
                                           Path(tmp) / "tiny-export", args, args.reps))

    if not args.tiny_only:
        from rapid.models import resolve_model

        try:
            resolve_model(args.draft)
        except RapidError as e:
            print(f"\nskipping the real draft: {e}", flush=True)
        else:
            t0 = time.perf_counter()
            m = ensure_export(args.draft, args.export_dir, args.force_export)
            results["export"] = {"dir": str(args.export_dir), "seconds_this_run": round(time.perf_counter() - t0, 1),
                                 "timings_s": m["timings_s"], "parity": m["parity"]}
            print("export timings (s): " + json.dumps(m["timings_s"]))
            for name, c in m["parity"]["cases"].items():
                print(f"  parity {name}: T={c['T']} P={c['P']} max|Δlogit| {c['max_abs_diff']:.3g} "
                      f"(bound {c['bound']:.3g}) top1 {c['top1_agree']:.2f}")
            results["models"].append(run_model("default draft (Qwen2.5-Coder-0.5B, fp32)", args.draft,
                                               args.export_dir, args, args.real_reps))

    print(f"\n## Draft step latency, {args.threads} thread(s), capacity {CAPACITY}, median\n")
    for r in results["models"]:
        print(markdown(r["label"], r["steps"]) + "\n")
        print(markdown_kv(r["label"] + ": KV boundary restore / compaction", r["kv_ops"]) + "\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
