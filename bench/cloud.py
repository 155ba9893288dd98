"""The bench's cloud process: ``rapid serve`` plus transport-delay emulation and CPU pinning.

    python -m rapid.bench.cloud --target T --port P [--cpus 1] [--rtt-ms 30 --jitter-ms 5]

It is ``rapid.server.main.run_serve`` with ``VerifierServer(answer_delay=...)`` set when the
network profile is emulated in the transport (no netem): each verdict and Ready are held for a sampled RTT
(the verifier's work and the edge are unaffected; only their arrival moves).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import signal

from rapid.bench.contention import pin
from rapid.bench.netem import NetProfile
from rapid.server.app import VerifierServer, serve_forever
from rapid.server.main import choose_verify_mode, load_target, measured_flat_nodes, startup_curve
from rapid.server.serve_config import Limits
from rapid.server.verify_curve import wire_curve


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rapid.bench.cloud")
    ap.add_argument("--target", required=True)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cpus", default="", help="comma-separated CPUs to pin to")
    ap.add_argument("--rtt-ms", type=float, default=0.0)
    ap.add_argument("--jitter-ms", type=float, default=0.0)
    ap.add_argument("--rate-mbit", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", default="auto", help="auto|bfloat16|float32|float64 (rapid.core.precision)")
    ap.add_argument("--verify", default="auto", choices=["auto", "tree", "sequential"])
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    if args.cpus:
        pin({int(c) for c in args.cpus.split(",")})

    model, _ = load_target(args.target, args.dtype, args.threads)
    mode = choose_verify_mode(model, args.verify)
    delay = None
    if args.rtt_ms > 0 or args.jitter_ms > 0:
        prof = NetProfile("emulated", args.rtt_ms, args.jitter_ms, args.rate_mbit or None)
        rng = random.Random(args.seed)

        def delay() -> float:
            return prof.sample_rtt_s(rng)

    points = startup_curve(model, mode)
    server = VerifierServer(model, Limits(), answer_delay=delay, verify_mode=mode,
                            flat_nodes=measured_flat_nodes(model, mode, points), curve=wire_curve(points))

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await serve_forever(server, args.host, args.port, stop=stop)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
