"""``rapid serve``'s scale-out flags (argparse only: the CLI imports this without torch or Ray)."""

from __future__ import annotations

import argparse

SCALE_FLAGS = ("replicas", "min_replicas", "max_replicas", "ray_address")  # any of them → Ray Serve


def add_scale_out_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scale-out on Ray Serve (needs the ray extra; docs/scale-out.md)")
    g.add_argument("--replicas", type=int, help="run N verifier replicas on Ray Serve behind one URL "
                   "(default: the single-process server)")
    g.add_argument("--min-replicas", type=int, help="autoscale between --min-replicas and --max-replicas")
    g.add_argument("--max-replicas", type=int)
    g.add_argument("--target-sessions", type=int, default=8, help="autoscaling: attached sessions per replica")
    g.add_argument("--num-gpus-per-replica", type=float, default=0.0)
    g.add_argument("--num-cpus-per-replica", type=float, default=1.0)
    g.add_argument("--ingress-replicas", type=int, default=1)
    g.add_argument("--drain", type=float, default=60.0, help="a stopping replica serves its sessions this long")
    g.add_argument("--ray-address", help="an existing Ray cluster (auto, ray://…, host:port; else $RAY_ADDRESS, "
                   "else a new local one)")
    g.add_argument("--replica-host", help="where each replica's own websocket listens (default: 127.0.0.1 on a "
                   "local cluster, 0.0.0.0 on an existing one)")


def wants_ray(args: argparse.Namespace) -> bool:
    return any(getattr(args, name, None) is not None for name in SCALE_FLAGS)


def scale_out_options(args: argparse.Namespace, names) -> dict:
    """The options dict ``rapid.server.ray_serve.run_ray_serve`` takes: the flags it knows."""
    return {k: v for k, v in vars(args).items() if k in names}
