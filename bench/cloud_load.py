"""Closed-loop load on a verifier URL: aggregate trees/s and verdict latency (planning numbers).

    python -m rapid.bench.cloud_load --url ws://127.0.0.1:8765 --sessions 8 --seconds 15 --nodes 8

Each of ``sessions`` websocket sessions sends ``Hello`` (a random prompt), then, as fast as the
verdicts come back, a random tree of ``nodes`` nodes (a chain of depth ``nodes``); no draft model
runs, so the number is the cloud's (ingress + replicas) capacity for that tree size:

    trees/s = verdicts received in the window / window length

The same command measures the single-process server and ``rapid serve --replicas N`` (one URL).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time

from websockets.asyncio.client import connect

from rapid.core.auth import bearer, load_token
from rapid.core.wire import (
    MAX_FRAME_BYTES,
    Bye,
    ErrorFrame,
    Hello,
    Ready,
    Tree,
    VerdictFrame,
    decode,
    encode,
)


async def _session(url: str, token: str | None, nodes: int, vocab: int, until: float, seed: int,
                   lat: list[float], replicas: set[str]) -> int:
    """One closed loop until ``until``; a session whose context is full says Bye and starts anew."""
    rng = random.Random(seed)
    done = 0
    while time.monotonic() < until:
        async with connect(url, max_size=MAX_FRAME_BYTES, compression=None, additional_headers=bearer(token)) as ws:
            await ws.send(encode(Hello([rng.randrange(vocab) for _ in range(16)], max_nodes=nodes)))
            ready = decode(await ws.recv())
            if not isinstance(ready, Ready):
                raise RuntimeError(f"no ready frame: {ready}")
            replicas.add(ready.session.rpartition(".")[0] or "single")
            budget, r = ready.capacity - 16 - 2 * (nodes + 1), 0
            while time.monotonic() < until and (r + 1) * (nodes + 1) < budget:
                r += 1
                t0 = time.perf_counter()
                await ws.send(encode(Tree(r, [rng.randrange(vocab) for _ in range(nodes)], list(range(-1, nodes - 1)))))
                v = decode(await ws.recv())
                if isinstance(v, ErrorFrame):
                    raise RuntimeError(f"cloud error: {v.code}: {v.reason}")
                assert isinstance(v, VerdictFrame)
                lat.append(time.perf_counter() - t0)
                done += 1
            await ws.send(encode(Bye()))
    return done


async def measure(url: str, sessions: int, seconds: float, nodes: int, token: str | None = None,
                  vocab: int = 256) -> dict:
    lat: list[float] = []
    replicas: set[str] = set()
    t0 = time.monotonic()
    counts = await asyncio.gather(*(_session(url, token, nodes, vocab, t0 + seconds, i, lat, replicas)
                                    for i in range(sessions)))
    wall = time.monotonic() - t0
    lat.sort()
    return {"url": url, "sessions": sessions, "nodes": nodes, "seconds": round(wall, 2),
            "trees": sum(counts), "trees_per_s": round(sum(counts) / wall, 1),
            "p50_ms": round(1e3 * statistics.median(lat), 2), "p95_ms": round(1e3 * lat[int(0.95 * (len(lat) - 1))], 2),
            "replicas_seen": len(replicas)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rapid.bench.cloud_load", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", required=True)
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--nodes", type=int, default=8, help="tree nodes per round")
    ap.add_argument("--vocab", type=int, default=256, help="draw token ids below this")
    ap.add_argument("--token-file")
    a = ap.parse_args(argv)
    print(json.dumps(asyncio.run(measure(a.url, a.sessions, a.seconds, a.nodes, load_token(a.token_file), a.vocab))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
