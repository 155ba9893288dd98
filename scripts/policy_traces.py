"""One trace per policy on a real pair, with a CPU load on the edge's core started halfway.

    python scripts/policy_traces.py --max-tokens 64 --out runs/traces

The cloud (`rapid serve`) is pinned to the last core, the edge and the load to core 0. The load
(a busy-looping process) starts when the edge has emitted half of its tokens, so CAAC's reaction
(ESR up, η and depth down) shows in the second half. Prints one summary per policy and the mean
depth / per-token draft latency before and after the load; writes `<policy>.jsonl` traces.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import statistics
import sys
from pathlib import Path

from rapid import models
from rapid.core.procs import free_port, start_server, stop_server
from rapid.runtime.generate import encode_prompt, open_edge_model
from rapid.runtime.policies import POLICIES
from rapid.runtime.session import EdgeSession
from rapid.runtime.telemetry import write_jsonl
from rapid.runtime.tree import TreeParams

PROMPT = "Write a Python function that merges two sorted lists into one sorted list, with a docstring."


def spin(core: int) -> None:
    os.sched_setaffinity(0, {core})
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draft", default="default-draft")
    ap.add_argument("--target", default="default-target")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--budget", type=int, default=8)
    ap.add_argument("--out", default="runs/traces")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cores = sorted(os.sched_getaffinity(0))
    edge_core, cloud_core = cores[0], cores[-1]
    target, draft = models.resolve_model(args.target), models.resolve_model(args.draft)
    port = free_port()
    proc = start_server(target, port, ["--threads", "1"], log_path=out / "serve.log")
    os.sched_setaffinity(proc.pid, {cloud_core})
    os.sched_setaffinity(0, {edge_core})
    url = f"ws://127.0.0.1:{port}"
    try:
        edge = open_edge_model(draft, "torch", 2048, 1)
        ids = encode_prompt(edge.tokenizer, PROMPT, chat=True)
        tree = TreeParams(args.depth, args.budget, 2, 2)
        reference = None
        for name in args.policies.split(","):
            load: list[mp.Process] = []
            emitted = 0

            def on_tokens(new, load=load):
                nonlocal emitted
                emitted += len(new)
                if not load and emitted >= args.max_tokens // 2:
                    p = mp.Process(target=spin, args=(edge_core,), daemon=True)
                    p.start()
                    load.append(p)

            with EdgeSession(edge, url, policy=name, tree=tree) as session:
                gen = asyncio.run(session.generate(ids, args.max_tokens, on_tokens=on_tokens))
            for p in load:
                p.terminate()
            if reference is None:
                reference = gen.tokens
            trace = out / f"{name}.jsonl"
            trace.unlink(missing_ok=True)
            write_jsonl(trace, gen.records)
            half = _split(gen.records, args.max_tokens // 2)
            print(gen.summary.line(), f"identical to first run: {gen.tokens == reference}")
            for label, recs in half.items():
                if recs:
                    print(f"    {label}: mean depth {statistics.fmean(r.depth for r in recs):.2f}, "
                          f"mean ESR {statistics.fmean(r.esr for r in recs):.2f}, "
                          f"mean eta {statistics.fmean(r.eta for r in recs):.2f}, "
                          f"draft s/round {statistics.fmean(r.draft_s for r in recs):.2f}")
            sys.stdout.flush()
        (out / "prompt.json").write_text(json.dumps({"prompt": PROMPT, "tokens": len(ids)}))
    finally:
        stop_server(proc)
    return 0


def _split(records, half_tokens):
    before, after, n = [], [], 0
    for r in records:
        (before if n < half_tokens else after).append(r)
        n += r.emitted
    return {"before load": before, "under load": after}


if __name__ == "__main__":
    sys.exit(main())
