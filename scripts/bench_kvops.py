#!/usr/bin/env python3
"""Time in-place KV compaction: native kernel vs numpy fancy indexing (single thread).

The buffer is ``[outer, cap, inner]`` float32, by default ``[96, 2048, 64]`` (roughly the 0.5B
draft: 24 layers x 2 (k, v) x 2 kv heads, head_dim 64). Each case moves ``m`` accepted rows,
scattered over a 128-slot tree region after a 1024-token prefix, down to the prefix end
(``dst`` ascending, ``dst <= src``) — what ``compact()`` does after verification.

Columns (microseconds per compaction, median over repeats):
  native      rapid.engines.native.gather_rows (argument checks + ctypes call)
  bound       rapid.engines.native.bind(buf).gather (buffer checked once)
  native-raw  the bare ctypes call on prepared index arrays (kernel + ctypes overhead)
  np-fancy    ``v[:, dst] = v[:, src]`` on the 3-D view
  np-ref      rapid.engines.native.gather_rows_numpy (the fallback)

    python scripts/bench_kvops.py [--outer 96 --cap 2048 --inner 64 --repeats 51]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402

from rapid.engines import kvops_abi, native  # noqa: E402

SIZES = (1, 2, 4, 8, 16, 32, 64)


def calibrate(fn: Callable[[], None], min_batch_s: float = 1e-3) -> int:
    """Calls per sample so that one sample lasts at least ``min_batch_s``."""
    fn()  # warm up
    batch = 1
    while batch < 1 << 16:
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        if time.perf_counter() - t0 >= min_batch_s:
            break
        batch *= 2
    return batch


def time_us(fns: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    """Median over ``repeats`` samples of the time per call, in microseconds. The methods are
    sampled round-robin so that they share whatever else the machine is doing."""
    batches = {k: calibrate(f) for k, f in fns.items()}
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            b = batches[k]
            t0 = time.perf_counter_ns()
            for _ in range(b):
                f()
            samples[k].append((time.perf_counter_ns() - t0) / b / 1e3)
    return {k: statistics.median(v) for k, v in samples.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--outer", type=int, default=96)
    ap.add_argument("--cap", type=int, default=2048)
    ap.add_argument("--inner", type=int, default=64)
    ap.add_argument("--dtype", default="float32", choices=["float16", "float32", "float64"])
    ap.add_argument("--prefix", type=int, default=1024, help="tokens before the tree region")
    ap.add_argument("--region", type=int, default=128, help="tree slots the rows come from")
    ap.add_argument("--repeats", type=int, default=51)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    if not native.cpu_available():
        print(f"native library unavailable: {native.cpu_status()}", file=sys.stderr)
        return 1
    if args.prefix + args.region > args.cap:
        ap.error("--prefix + --region must not exceed --cap")

    rng = np.random.default_rng(args.seed)
    dtype = np.dtype(args.dtype)
    buf = rng.standard_normal((args.outer, args.cap, args.inner)).astype(dtype)
    lib = native._load(native.CPU_LIB)[0]
    raw = getattr(lib, f"rapid_kv_gather_{kvops_abi._SUFFIX[dtype.itemsize]}")
    p = buf.ctypes.data
    bound = native.bind(buf, backend="native")

    print(f"# compaction in a [{args.outer}, {args.cap}, {args.inner}] {dtype} buffer "
          f"({buf.nbytes / 2**20:.0f} MiB), single thread, median of {args.repeats}; "
          f"{native.cpu_status()}")
    header = (f"{'m':>4} {'native us':>10} {'bound us':>9} {'native-raw':>11} "
              f"{'np-fancy us':>12} {'np-ref us':>10} {'fancy/native':>13}")
    print(header)
    print("-" * len(header))
    for m in SIZES:
        m = min(m, args.region)
        src = np.sort(rng.choice(np.arange(args.prefix, args.prefix + args.region), m,
                                 replace=False)).astype(np.int64)
        dst = np.arange(args.prefix, args.prefix + m, dtype=np.int64)
        sp, dp = src.ctypes.data, dst.ctypes.data

        def run_native(src=src, dst=dst):
            native.gather_rows(buf, src, dst, backend="native")

        def run_bound(src=src, dst=dst):
            bound.gather(src, dst)

        def run_raw(sp=sp, dp=dp, m=m):
            raw(p, args.outer, args.cap, args.inner, sp, dp, m)

        def run_fancy(src=src, dst=dst):
            buf[:, dst] = buf[:, src]

        def run_ref(src=src, dst=dst):
            native.gather_rows_numpy(buf, src, dst)

        t = time_us({"native": run_native, "bound": run_bound, "raw": run_raw,
                     "fancy": run_fancy, "ref": run_ref}, args.repeats)
        t_nat, t_bound, t_raw, t_fancy, t_ref = (t[k] for k in ("native", "bound", "raw",
                                                                 "fancy", "ref"))
        print(f"{m:>4} {t_nat:>10.1f} {t_bound:>9.1f} {t_raw:>11.1f} {t_fancy:>12.1f} {t_ref:>10.1f} "
              f"{t_fancy / t_nat:>12.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
