"""The tree and sampling options every edge command shares (``rapid generate``, ``demo``, ``edge``)."""

from __future__ import annotations

import argparse

from rapid.runtime.tree import AUTO_BUDGET_CAP, AUTO_BUDGET_FALLBACK, AUTO_BUDGET_MIN, TreeParams


def budget_arg(text: str) -> int | str:
    """``--budget``: a positive integer or ``auto``."""
    if text == "auto":
        return text
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"budget must be a positive integer or 'auto', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"budget must be >= 1, got {value}")
    return value


def tree_params(depth: int, budget: int | str, topk: int, width: int) -> TreeParams:
    """TreeParams from the command line's values (``budget`` may be ``auto``)."""
    if budget == "auto":
        return TreeParams(depth, AUTO_BUDGET_CAP, topk, width, auto_budget=True)
    return TreeParams(depth, int(budget), topk, width)


def add_tree_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="rapid", help="fixed|npdg|ipdg|caac|rapid|edgellm|ar (default rapid)")
    p.add_argument("--depth", type=int, default=4, help="tree depth (fixed policies) / initial depth (CAAC)")
    p.add_argument("--budget", type=budget_arg, default="auto",
                   help="max tree nodes kept per round, or auto: as many as the cloud verifies at about one "
                        f"step's cost (its measured verify curve), at least {AUTO_BUDGET_MIN}; "
                        f"{AUTO_BUDGET_FALLBACK} if it has none")
    p.add_argument("--topk", type=int, default=2, help="children per expanded node")
    p.add_argument("--width", type=int, default=2, help="nodes expanded per step")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--seed", type=int, default=0, help="sampling seed (draws depend on (seed, position))")
    p.add_argument("--threads", type=int, default=1, help="torch/ORT threads in this process")
