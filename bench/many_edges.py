"""Many edges on one cloud: aggregate throughput of N concurrent rapid edges vs N ``ar`` clients.

    python -m rapid.bench.many_edges [--edges 1,4,8] [--max-tokens 32] [--repeats 3] [--out F.json]

One ``rapid serve`` (the default target, its auto dtype, batching on: ``--max-batch 8``) on the
second core; N edges in this process on the first core (N draft engines over one copy of the
int4 draft's weights, ``rapid.runtime.generate.open_edge_models``), each generating one prompt
(oasst, or the built-in ones) at the same time. Then the same N prompts with policy ``ar``: the
target alone, one token per forward, batched by the same server. Per (N, policy), medians of
``--repeats``:

    aggregate tok/s   all tokens / wall time of the wave
    per-edge tok/s    each edge's tokens / its own wall time (median over edges)
    token latency     per committed round: gap since the previous round / tokens it brought,
                      one sample per token (p50, p99 over all edges)
    per forward       from the server's /metrics over the wave: trees batched, rows (tree nodes
                      + one root each) and milliseconds of one target forward

and whether every rapid edge emitted exactly the ``ar`` tokens of its prompt.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
import urllib.request
from pathlib import Path

from rapid import models
from rapid.bench.md_table import md_table
from rapid.bench.prompts import load_sets, pick
from rapid.core.procs import free_port, split_cores, start_server, stop_server
from rapid.core.sampling import SamplingParams
from rapid.export.fast_draft import resolve_draft
from rapid.runtime.edge_config import DEFAULT
from rapid.runtime.generate import encode_prompt, open_edge_models
from rapid.runtime.session import EdgeSession

SERVER_FIGURES = {"trees": "rapid_verify_batch_size_sum", "forwards": "rapid_verify_batch_size_count",
                  "forward_s": "rapid_target_forward_seconds_sum", "nodes": "rapid_spec_decode_num_draft_tokens_total"}


def _server_figures(url: str) -> dict[str, float]:
    """The server's counters this bench reads (SERVER_FIGURES), from its /metrics."""
    text = urllib.request.urlopen(url.replace("ws://", "http://") + "/metrics", timeout=10).read().decode()
    values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("rapid_")}
    return {k: values.get(name, 0.0) for k, name in SERVER_FIGURES.items()}


def _per_forward(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Over a wave: trees per forward, rows per forward (nodes + one root per tree), ms per forward."""
    d = {k: after[k] - before[k] for k in before}
    n = max(1.0, d["forwards"])
    return {"trees": d["trees"] / n, "rows": (d["nodes"] + d["trees"]) / n, "ms": 1e3 * d["forward_s"] / n}


async def _one(session: EdgeSession, ids: list[int], max_new: int) -> dict:
    t0 = time.perf_counter()
    last, gaps = t0, []

    def on_tokens(chunk: list[int]) -> None:
        nonlocal last
        now = time.perf_counter()
        gaps.extend([(now - last) / len(chunk)] * len(chunk))
        last = now

    gen = await session.generate(ids, max_new, SamplingParams(), on_tokens)
    return {"tokens": gen.tokens, "wall": time.perf_counter() - t0, "gaps": gaps}


async def _wave(sessions: list[EdgeSession], prompts: list[list[int]], max_new: int) -> tuple[list[dict], float]:
    t0 = time.perf_counter()
    runs = await asyncio.gather(*(_one(s, p, max_new) for s, p in zip(sessions, prompts, strict=True)))
    return list(runs), time.perf_counter() - t0


def _row(n: int, policy: str, waves: list[tuple[list[dict], float, float]]) -> dict:
    agg = [sum(len(r["tokens"]) for r in runs) / wall for runs, wall, _ in waves]
    per_edge = [statistics.median(len(r["tokens"]) / r["wall"] for r in runs) for runs, _, _ in waves]
    gaps = sorted(g for runs, _, _ in waves for r in runs for g in r["gaps"])
    return {"edges": n, "policy": policy, "aggregate_tok_s": round(statistics.median(agg), 2),
            "per_edge_tok_s": round(statistics.median(per_edge), 2),
            "p50_ms_per_token": round(1e3 * gaps[len(gaps) // 2], 1),
            "p99_ms_per_token": round(1e3 * gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))], 1),
            **{f"{k}_per_forward": round(statistics.median(b[k] for _, _, b in waves), 1 if k == "ms" else 2)
               for k in ("trees", "rows", "ms")}}


def run(edges: list[int], max_new: int, repeats: int, target: str, draft: str) -> dict:
    models.fetch_default(("target",))
    cores = split_cores()
    if cores:  # the edges on the first core, the cloud on the second (as rapid demo and rapid bench)
        os.sched_setaffinity(0, cores[0])
    port = free_port()
    proc = start_server(models.resolve_model(target), port, ["--threads", "1", "--max-batch", "8"],
                        cpus=cores[1] if cores else None)
    url = f"ws://127.0.0.1:{port}"
    try:
        pool = open_edge_models(resolve_draft(draft), DEFAULT.engine, DEFAULT.capacity, 1, max(edges))
        texts = [p.text for p in pick(load_sets(None, ["oasst"]).get("oasst") or load_sets(None)["builtin"], max(edges))]
        prompts = [encode_prompt(pool[0].tokenizer, t, True)[-64:] for t in texts]
        rows, same = [], True
        for n in edges:
            sessions = {pol: [EdgeSession(m, url, policy=pol) for m in pool[:n]] for pol in ("ar", "rapid")}
            asyncio.run(_wave(sessions["rapid"][:1], prompts[:1], 4))  # warm-up: KV, kernels, the curve
            outputs: dict[str, list] = {}
            for policy in ("ar", "rapid"):
                waves = []
                for _ in range(repeats):
                    before = _server_figures(url)
                    runs, wall = asyncio.run(_wave(sessions[policy], prompts[:n], max_new))
                    waves.append((runs, wall, _per_forward(before, _server_figures(url))))
                    outputs.setdefault(policy, [r["tokens"] for r in runs])
                rows.append(_row(n, policy, waves))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
            same = same and outputs["rapid"] == outputs["ar"]
            for s in (s for group in sessions.values() for s in group):
                s.close()
        return {"rows": rows, "identical": same, "max_new": max_new, "repeats": repeats, "draft": draft,
                "target": target, "cores": [sorted(c) for c in cores] if cores else None}
    finally:
        stop_server(proc)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rapid.bench.many_edges", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--edges", default="1,4,8", help="comma list of concurrent edge counts")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--target", default="default-target")
    ap.add_argument("--draft", default=DEFAULT.draft)
    ap.add_argument("--out", help="also write the result as JSON here")
    a = ap.parse_args(argv)
    result = run([int(x) for x in a.edges.split(",")], a.max_tokens, a.repeats, a.target, a.draft)
    keys = ("edges", "policy", "aggregate_tok_s", "per_edge_tok_s", "p50_ms_per_token", "p99_ms_per_token",
            "trees_per_forward", "rows_per_forward", "ms_per_forward")
    print("\n".join(md_table(["edges", "policy", "aggregate tok/s", "per-edge tok/s", "ms/token p50", "p99",
                               "per forward: trees", "rows", "ms"], ([r[k] for k in keys] for r in result["rows"]))))
    print(f"identical to ar on every prompt: {'yes' if result['identical'] else 'NO'}")
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    return 0 if result["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
