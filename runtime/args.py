"""The options every edge command shares (``rapid generate``, ``demo``, ``edge``): tree,
sampling, the cloud (URL, token, CA), the draft's context, and the help formatter (defaults shown).

One meaning per option name across subcommands: ``--engine`` is the draft backend, ``--draft``
the model or export folder, ``--max-context`` a context capacity (the draft's here, the target's
in ``rapid serve``), ``--children`` the tree's children per expanded node (``--top-k`` is
sampling). Older spellings (``--topk``, ``--capacity``, ``--backend``) still parse.
"""

from __future__ import annotations

import argparse
import urllib.parse

from rapid.runtime.policies import POLICIES
from rapid.runtime.tree import AUTO_BUDGET_CAP, AUTO_BUDGET_MIN, TreeParams


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


DEFAULT_LOOKUP = TreeParams().lookup
DEFAULT_MIN_P = 0.03  # with the auto budget's floor of 11 nodes: vs-ar bench median 1.83x vs 1.69x without
# (Zen 5, bf16 row kernels); TreeParams itself defaults to no floor (tests rely on exact shapes)


def tree_params(depth: int, budget: int | str, topk: int, width: int, coupled: bool = True,
                lookup: int = DEFAULT_LOOKUP, min_p: float = DEFAULT_MIN_P) -> TreeParams:
    """TreeParams from the command line's values (``budget`` may be ``auto``)."""
    if budget == "auto":
        return TreeParams(depth, AUTO_BUDGET_CAP, topk, width, auto_budget=True, coupled=coupled, lookup=lookup,
                          min_p=min_p)
    return TreeParams(depth, int(budget), topk, width, coupled=coupled, lookup=lookup, min_p=min_p)


# The edge's tree defaults, for the command line and for code that builds an edge without it
# (rapid.runtime.api.Edge, EdgeService(tree=None)): one place.
DEFAULT_DEPTH, DEFAULT_BUDGET, DEFAULT_CHILDREN, DEFAULT_WIDTH = 4, "auto", 2, 2


def default_tree() -> TreeParams:
    """The tree every edge command gets without tree options."""
    return tree_params(DEFAULT_DEPTH, DEFAULT_BUDGET, DEFAULT_CHILDREN, DEFAULT_WIDTH)


def tree_params_of(args: argparse.Namespace) -> TreeParams:
    """TreeParams from the options ``add_tree_args`` added."""
    return tree_params(args.depth, args.budget, args.topk, args.width, args.coupled, args.lookup, args.min_p)


BACKENDS = ("auto", "torch", "onnx", "trt")


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Module docstrings as written, and every valued option's default in its help. A flag's help
    says what giving it does: its stored default (``--no-coupled … (default: True)``) would read
    as the opposite."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.nargs == 0:
            return action.help
        return super()._get_help_string(action)


def cloud_url(text: str) -> str:
    """``--cloud``: ws://HOST:PORT or wss://HOST:PORT, checked before any model loads."""
    parts = urllib.parse.urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("ws", "wss") or not parts.hostname or port is None:
        raise argparse.ArgumentTypeError(f"expected ws://HOST:PORT or wss://HOST:PORT, got {text!r}")
    return text


def add_cloud_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cloud", type=cloud_url, default="ws://127.0.0.1:8765", help="URL of rapid serve")
    p.add_argument("--token-file", help="shared secret for the cloud (else $RAPID_TOKEN; none: no token)")
    p.add_argument("--cafile", help="CA / self-signed certificate to trust for wss://")


def add_context_arg(p: argparse.ArgumentParser, default: int = 2048) -> None:
    p.add_argument("--max-context", "--capacity", dest="capacity", type=int, default=default,
                   help="the draft's KV capacity: prompt + output + tree slots")


def add_coupled_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-coupled", dest="coupled", action="store_false",
                   help="under sampling, rank draft children by the draft's own log-softmax instead of coupling "
                        "them to the target's seeded noise (rapid.runtime.coupling); without the flag they are coupled")


def add_growth_args(p: argparse.ArgumentParser) -> None:
    """The tree-growth options the edge commands and the bench share."""
    p.add_argument("--lookup", type=int, default=DEFAULT_LOOKUP,
                   help="prompt-lookup tokens merged into each tree at no draft step (continuations of earlier "
                        "matches of the last tokens, rapid.runtime.lookup); 0 = off")
    p.add_argument("--min-p", type=float, default=DEFAULT_MIN_P,
                   help="send no tree node whose path probability (draft, or learnt lookup) is below this; 0 = off")


def add_tree_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--policy", default="rapid", choices=list(POLICIES), help="speculation policy")
    p.add_argument("--depth", type=int, default=DEFAULT_DEPTH, help="tree depth (fixed policies) / initial depth (CAAC)")
    p.add_argument("--budget", type=budget_arg, default=DEFAULT_BUDGET,
                   help="max tree nodes kept per round, or auto: as many as the cloud verifies at about one "
                        f"step's cost (its measured verify curve), at least {AUTO_BUDGET_MIN} (--min-p keeps "
                        "unlikely nodes out)")
    p.add_argument("--children", "--topk", dest="topk", type=int, default=DEFAULT_CHILDREN,
                   help="tree children per expanded node (not sampling's --top-k)")
    p.add_argument("--width", type=int, default=DEFAULT_WIDTH, help="nodes expanded per step (best first, at any depth)")
    add_growth_args(p)
    add_coupled_arg(p)
    p.add_argument("--max-tokens", type=int, default=64, help="new tokens to generate at most")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0, help="sampling nucleus (1 = off)")
    p.add_argument("--top-k", type=int, default=0, help="sampling top-k (0 = off)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (draws depend on (seed, position))")
    p.add_argument("--threads", type=int, default=1, help="torch/ORT threads in this process")
