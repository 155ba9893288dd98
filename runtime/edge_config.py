"""Every option the edge commands share, written once (torch-free: ``rapid --help`` reads it).

    EdgeConfig             the options: ``rapid generate --depth 3 …`` ⇄ ``EdgeConfig(depth=3, …)``
      .tree()     → TreeParams       the tree every round grows (``--budget auto`` resolved)
      .sampling() → SamplingParams   the request's sampling
    add_edge_args(p, *groups)        argparse flags made from the fields of those groups:
                                     flag names, type, default, choices and help from the field
    EdgeConfig.of(ns)                the config from parsed flags (unknown attributes ignored)
    DEFAULT                          EdgeConfig(): the defaults everyone else reads
    HelpFormatter                    every command's help: docstrings as written, defaults shown

``rapid generate``, ``rapid demo``, ``rapid edge``, ``rapid bench``, the Python API
(``rapid.runtime.api.Edge``) and the daemon's ``EdgeService`` take their defaults from here, so
a user gets the same draft (the int4 export: the fastest measured) and the same tree whichever
door they come in by. Groups: ``draft`` (model, backend, context, threads), ``cloud`` (URL,
token, CA), ``tree`` (policy and growth), ``sampling`` (tokens, temperature, top-p/k, seed).
"""

from __future__ import annotations

import argparse
import math
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from rapid.core.errors import OptionError
from rapid.core.sampling import SamplingParams
from rapid.export.fast_draft import FAST_DRAFT
from rapid.runtime.caac import CAACConfig
from rapid.runtime.policies import POLICIES
from rapid.runtime.tree import AUTO_BUDGET_CAP, AUTO_BUDGET_MIN, TreeParams

BACKENDS = ("auto", "torch", "onnx", "trt")
GROUPS = {"draft": "the draft", "cloud": "the cloud verifier", "tree": "speculation and tree growth",
          "sampling": "decoding"}  # argparse group titles


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


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Module docstrings as written, and every valued option's default in its help. A flag's help
    says what giving it does: its stored default (``--no-coupled … (default: True)``) would read
    as the opposite."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.nargs == 0:
            return action.help
        return super()._get_help_string(action)


def _opt(default: Any, group: str, help: str, *flags: str, type: Callable | None = None,  # noqa: A002
         choices: tuple[str, ...] | None = None) -> Any:
    return field(default=default, metadata={"group": group, "help": help, "flags": flags, "type": type,
                                            "choices": choices})


MAX_DEPTH = CAACConfig().max_depth  # the deepest tree any depth controller plans (--depth: fixed, or CAAC's start)


@dataclass(slots=True, frozen=True)
class EdgeConfig:
    """The edge's options; each field is one flag (``min_p`` → ``--min-p``, or the names in its
    metadata's ``flags``: the first is the one help shows, the rest older spellings)."""

    draft: str = _opt(FAST_DRAFT, "draft", f"{FAST_DRAFT} (ONNX, int4 weights; built once), an HF id, local "
                      "folder, .gguf, an export folder (rapid export), or default-draft (the PyTorch draft)")
    engine: str = _opt("auto", "draft", "draft backend (auto: onnx for an export folder, else torch)",
                       "--engine", "--backend", choices=BACKENDS)
    capacity: int = _opt(2048, "draft", "the draft's KV capacity: prompt + output + tree slots",
                         "--max-context", "--capacity")
    threads: int = _opt(1, "draft", "torch/ORT threads in this process")
    cloud: str = _opt("ws://127.0.0.1:8765", "cloud", "URL of rapid serve", type=cloud_url)
    token_file: str | None = _opt(None, "cloud", "shared secret for the cloud (else $RAPID_TOKEN; none: no token)")
    cafile: str | None = _opt(None, "cloud", "CA / self-signed certificate to trust for wss://")
    # rapid-cost: the fastest policy in 8 of 10 loaded cells of the slow-edge bench, no set below
    # fixed without load (Zen 3, docs/results.md); rapid was fastest in 2 of 10
    policy: str = _opt("rapid-cost", "tree", "speculation policy", choices=tuple(POLICIES))
    depth: int = _opt(4, "tree", "tree depth (fixed policies) / initial depth (CAAC)")
    budget: int | str = _opt("auto", "tree", "max tree nodes kept per round, or auto: as many as the cloud "
                             f"verifies at about one step's cost (its measured verify curve), at least "
                             f"{AUTO_BUDGET_MIN} (--min-p keeps unlikely nodes out)", type=budget_arg)
    topk: int = _opt(2, "tree", "tree children per expanded node (not sampling's --top-k)", "--children", "--topk")
    width: int = _opt(2, "tree", "nodes expanded per step (best first, at any depth)")
    # 16: vs-ar oasst 3.33 -> 3.75x ar (verdicts took whole 8-token chains in 40 % of its rounds), other
    # sets 0.99-1.05x of 8; 24 no better (the verify is +25 % at 19 nodes here; Xeon with AMX,
    # docs/results.md 2026-12-04 night); TreeParams keeps 8 for the tests' exact shapes
    lookup: int = _opt(16, "tree", "prompt-lookup tokens merged into each tree at no draft step "
                       "(continuations of earlier matches of the last tokens, rapid.runtime.lookup); 0 = off")
    # with the auto budget's floor of 11 nodes: vs-ar bench median 1.83x vs 1.69x without (Zen 5,
    # bf16 row kernels); TreeParams itself has no floor (tests rely on exact shapes)
    min_p: float = _opt(0.03, "tree", "send no tree node whose path probability (draft, or learnt lookup) is "
                        "below this; 0 = off")
    coupled: bool = _opt(True, "tree", "under sampling, rank draft children by the draft's own log-softmax "
                         "instead of coupling them to the target's seeded noise (rapid.runtime.coupling); "
                         "without the flag they are coupled", "--no-coupled")
    # 3 roots at decay 1: vs-ar 1.00-1.14x rapid-cost's 1 root at decay 0.1 on every set in two runs, the
    # slow edge 0.98-1.07x (Xeon with AMX, docs/results.md 2026-12-04 evening); TreeParams keeps 1 / 0.1
    branch_roots: int = _opt(3, "tree", "roots of the proactive branch: the likeliest verdict outcomes (accepted "
                             "path end, bonus token), fed in its first steps (rapid.runtime.ipdg)")
    branch_decay: float = _opt(1.0, "tree", "how much rarer a verdict that stops inside the "
                               "tree (every drafted child rejected) is than the draft believes: a proactive root "
                               "there scores log of this below a leaf's (rapid.runtime.ipdg); 1 = as the draft says")
    cost_cut: bool = _opt(True, "tree", "send all the nodes the budget keeps instead of only the best ones whose "
                          "expected accepted tokens pay for their verify time on the cloud's curve "
                          "(rapid.runtime.tree_cut), and draft every planned level; without the flag the tree is cut "
                          "and no level is drafted that the cut would drop", "--no-cost-cut")
    max_tokens: int = _opt(64, "sampling", "new tokens to generate at most")
    temperature: float = _opt(0.0, "sampling", "0 = greedy")
    top_p: float = _opt(1.0, "sampling", "sampling nucleus (1 = off)")
    top_k: int = _opt(0, "sampling", "sampling top-k (0 = off)")
    seed: int = _opt(0, "sampling", "sampling seed (draws depend on (seed, position))")

    @classmethod
    def of(cls, namespace: argparse.Namespace | dict) -> EdgeConfig:
        values = namespace if isinstance(namespace, dict) else vars(namespace)
        return cls(**{f.name: values[f.name] for f in fields(cls) if values.get(f.name) is not None})

    def tree(self) -> TreeParams:
        """The TreeParams of these options (``auto``: the cap, sized per session from the cloud's curve)."""
        auto = self.budget == "auto"
        return TreeParams(self.depth, AUTO_BUDGET_CAP if auto else int(self.budget), self.topk, self.width,
                          auto_budget=auto, coupled=self.coupled, lookup=self.lookup, min_p=self.min_p,
                          branch_roots=self.branch_roots, branch_decay=self.branch_decay,
                          cost_cut=self.cost_cut)

    def sampling(self) -> SamplingParams:
        return SamplingParams(self.temperature, self.top_p, self.top_k, self.seed)

    def __post_init__(self) -> None:
        rules = (("max_tokens", self.max_tokens >= 1, ">= 1"), ("capacity", self.capacity >= 1, ">= 1"),
                 ("threads", self.threads >= 1, ">= 1"), ("top_k", 0 <= self.top_k < 2**31, "in [0, 2**31)"),
                 ("temperature", math.isfinite(self.temperature) and self.temperature >= 0, ">= 0"),
                 ("top_p", 0 < self.top_p <= 1, "in (0, 1]"), ("min_p", 0 <= self.min_p < 1, "in [0, 1)"),
                 ("lookup", self.lookup >= 0, ">= 0"), ("branch_decay", 0 < self.branch_decay <= 1, "in (0, 1]"),
                 ("seed", 0 <= self.seed < 2**63, "in [0, 2**63)"),
                 ("depth", 1 <= self.depth <= MAX_DEPTH, f"in [1, {MAX_DEPTH}]"),
                 *((name, getattr(self, name) >= 1, ">= 1") for name in ("topk", "width", "branch_roots")))
        for name, ok, rule in rules:
            if not ok:
                flag = (_FIELDS[name].metadata["flags"] or (f"--{name.replace('_', '-')}",))[0]
                raise OptionError(f"{flag} must be {rule}, got {getattr(self, name)}")


_FIELDS = {f.name: f for f in fields(EdgeConfig)}
DEFAULT = EdgeConfig()


def group_fields(group: str) -> tuple[str, ...]:
    """The names of the options in one ``GROUPS`` group, in declaration order."""
    if group not in GROUPS:
        raise ValueError(f"unknown option group {group!r}; choose from {', '.join(GROUPS)}")
    return tuple(name for name, f in _FIELDS.items() if f.metadata["group"] == group)


def add_edge_args(parser: argparse.ArgumentParser, *groups: str, exclude: tuple[str, ...] = ()) -> None:
    """One flag per EdgeConfig field of ``groups`` (all four if none), except ``exclude``; each
    group under its own heading in ``--help``."""
    unknown = set(groups) - set(GROUPS)
    if unknown:
        raise ValueError(f"unknown option groups {sorted(unknown)}; have {list(GROUPS)}")
    sections: dict[str, Any] = {}
    for f in fields(EdgeConfig):
        m = f.metadata
        if (groups and m["group"] not in groups) or f.name in exclude:
            continue
        if m["group"] not in sections:
            sections[m["group"]] = parser.add_argument_group(GROUPS[m["group"]])
        names = m["flags"] or (f"--{f.name.replace('_', '-')}",)
        if isinstance(f.default, bool):
            sections[m["group"]].add_argument(*names, dest=f.name, help=m["help"],
                                              action="store_false" if f.default else "store_true")
            continue
        kind = m["type"] or (type(f.default) if f.default is not None else str)
        sections[m["group"]].add_argument(*names, dest=f.name, type=kind, default=f.default, choices=m["choices"],
                                          metavar=None if m["choices"] else names[0][2:].upper().replace("-", "_"),
                                          help=m["help"])
