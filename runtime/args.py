"""The tree and sampling options every edge command shares (``rapid generate``, ``demo``, ``edge``)."""

from __future__ import annotations

import argparse


def add_tree_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="rapid", help="fixed|npdg|ipdg|caac|rapid|edgellm|ar (default rapid)")
    p.add_argument("--depth", type=int, default=4, help="tree depth (fixed policies) / initial depth (CAAC)")
    p.add_argument("--budget", type=int, default=8, help="max tree nodes kept per round")
    p.add_argument("--topk", type=int, default=2, help="children per expanded node")
    p.add_argument("--width", type=int, default=2, help="nodes expanded per step")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed (draws depend on (seed, position))")
    p.add_argument("--threads", type=int, default=1, help="torch/ORT threads in this process")
