"""Load the cloud verifier with many simulated edges (tiny model, loopback only, bounded).

    python scripts/load_test.py [--edges 1,4,16,64] [--seconds 6] [--nodes 8] [--hidden 256]

The verifier runs in its own process (``rapid.server.app.VerifierServer`` over a tiny random
float32 target). Each simulated edge opens a session (random 32-token prompt) and sends random
trees of ``--nodes`` nodes back to back, measuring each tree → verdict latency. For every edge
count the script reports verify throughput (trees/s and committed tokens/s), p50/p99 latency and
the server's peak RSS, batched (``--max-batch``, ``--window-ms``) and, at ``--compare-at`` edges,
unbatched too. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import time


def _serve(folder: str, max_batch: int, window_ms: float, port_q, stop_ev) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import logging

    import torch
    from transformers import AutoModelForCausalLM

    from rapid.modeling import Decoder
    from rapid.server.app import VerifierServer, serve_forever
    from rapid.server.serve_config import Limits

    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    model = Decoder.from_hf(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32))
    server = VerifierServer(model, Limits(max_sessions=256, max_context=8192, max_nodes=64),
                            max_batch=max_batch, batch_window_ms=window_ms)

    async def main() -> None:
        ready, stop = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(serve_forever(server, "127.0.0.1", 0, ready, stop))
        await ready.wait()
        port_q.put(server.port)
        while not stop_ev.is_set():
            await asyncio.sleep(0.1)
        stop.set()
        await task

    asyncio.run(main())


def _rss_peak_mb(pid: int) -> float:
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


async def _edge(url: str, seed: int, nodes: int, deadline: float, max_rounds: int, lat: list, tokens: list) -> None:
    from websockets.asyncio.client import connect

    from rapid.core.wire import Hello, Ready, Tree, VerdictFrame, decode, encode

    rng = random.Random(seed)
    async with connect(url, compression=None) as ws:
        await ws.send(encode(Hello([rng.randrange(256) for _ in range(32)])))
        assert isinstance(decode(await ws.recv()), Ready)
        r = 0
        while time.perf_counter() < deadline and r < max_rounds:
            toks = [rng.randrange(256) for _ in range(nodes)]
            parents = [-1 if j == 0 else rng.randrange(-1, j) for j in range(nodes)]
            t0 = time.perf_counter()
            await ws.send(encode(Tree(r, toks, parents)))
            v = decode(await ws.recv())
            assert isinstance(v, VerdictFrame), v
            lat.append(time.perf_counter() - t0)
            tokens.append(len(v.path) + 1)
            r += 1


def run_config(folder: str, edges: int, seconds: float, nodes: int, max_batch: int, window_ms: float,
               max_rounds: int) -> dict:
    ctx = mp.get_context("spawn")
    port_q, stop_ev = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_serve, args=(folder, max_batch, window_ms, port_q, stop_ev), daemon=True)
    proc.start()
    try:
        port = port_q.get(timeout=120)
        url = f"ws://127.0.0.1:{port}"
        lat: list[float] = []
        toks: list[int] = []

        async def all_edges() -> float:
            await _edge(url, 999, nodes, time.perf_counter() + 0.5, 5, [], [])  # warm-up
            t0 = time.perf_counter()
            deadline = t0 + seconds
            await asyncio.gather(*(_edge(url, i, nodes, deadline, max_rounds, lat, toks) for i in range(edges)))
            return time.perf_counter() - t0

        wall = asyncio.run(all_edges())
        lat.sort()
        return {"edges": edges, "batch": max_batch, "trees_s": len(lat) / wall, "tok_s": sum(toks) / wall,
                "p50_ms": 1000 * statistics.median(lat), "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
                "rss_mb": _rss_peak_mb(proc.pid), "rounds": len(lat)}
    finally:
        stop_ev.set()
        proc.join(10)
        if proc.is_alive():
            proc.kill()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--edges", default="1,4,16,64")
    ap.add_argument("--seconds", type=float, default=6.0, help="per configuration")
    ap.add_argument("--max-rounds", type=int, default=2000, help="per edge")
    ap.add_argument("--nodes", type=int, default=8, help="tree nodes per verification")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--window-ms", type=float, default=2.0)
    ap.add_argument("--compare-at", type=int, default=16, help="also run unbatched at this edge count")
    args = ap.parse_args(argv)
    from rapid.tiny import build_tiny

    folder = str(build_tiny(tempfile.mkdtemp() + "/target", seed=0, hidden=args.hidden, layers=args.layers,
                            heads=8, kv_heads=2))
    rows = []
    for n in (int(x) for x in args.edges.split(",")):
        rows.append(run_config(folder, n, args.seconds, args.nodes, args.max_batch, args.window_ms, args.max_rounds))
        if n == args.compare_at:
            rows.append(run_config(folder, n, args.seconds, args.nodes, 1, 0.0, args.max_rounds))
        print(f"done: {n} edges", file=sys.stderr, flush=True)
    print(f"\ntiny target: hidden {args.hidden}, {args.layers} layers, float32, 1 torch thread; "
          f"trees of {args.nodes} nodes; {args.seconds:.0f} s per row; loopback\n")
    print("| edges | max batch | trees/s | tokens/s | p50 ms | p99 ms | server peak RSS MB |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['edges']} | {r['batch']} | {r['trees_s']:.0f} | {r['tok_s']:.0f} | {r['p50_ms']:.1f} | "
              f"{r['p99_ms']:.1f} | {r['rss_mb']:.0f} |")
    by = {(r["edges"], r["batch"]): r for r in rows}
    b, u = by.get((args.compare_at, args.max_batch)), by.get((args.compare_at, 1))
    if b and u:
        print(f"\nbatched / unbatched at {args.compare_at} edges: {b['trees_s'] / u['trees_s']:.2f}x verify throughput")
    return 0


if __name__ == "__main__":
    sys.exit(main())
