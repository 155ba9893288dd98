"""One request's tree budget and token room, settled in one place (pure: plain data in and out).

Draft side, before anything starts (``settle_draft``). Every kept node may take draft KV slots in
D_i, the proactive branch D_{i+1} and their children, so a request needs

    len(prompt) + max_new + SLOTS_PER_NODE · budget + SLOT_MARGIN  <=  the draft's capacity

An ``auto`` budget (a cap) shrinks to fit; a budget that still does not fit is ContextFullError.

Cloud side, from its ``Ready`` (``settle_cloud``): an auto budget becomes
``min(cap, max_nodes, max(AUTO_BUDGET_MIN, flat_nodes))`` (``TreeParams.for_cloud``); an explicit
budget above the cloud's ``max_nodes`` is CloudError("limits"). The last round commits
prompt + max_new − 1 tokens before its tree, so the cloud (prefix KV, root, nodes, bonus) needs

    len(prompt) + max_new + budget  <=  Ready.capacity           (budget 0 for ``ar``)

A request without max_tokens gets ``default_max_tokens``: what the draft's context holds after
the prompt and the slots of RESERVED_AUTO_NODES nodes (auto) or of the whole explicit budget —
so ``settle_draft`` then leaves an auto budget at RESERVED_AUTO_NODES or more.
"""

from __future__ import annotations

from dataclasses import replace

from rapid.core.errors import ContextFullError
from rapid.core.wire import Ready
from rapid.runtime.link import CloudError
from rapid.runtime.tree import TreeParams

SLOTS_PER_NODE = 4  # draft KV slots a budgeted node may take (D_i, D_{i+1} and their children)
SLOT_MARGIN = 32  # spare draft slots (pending tokens, the bonus)
RESERVED_AUTO_NODES = 16  # nodes an auto budget keeps room for when the request names no max_tokens


def draft_need(prompt_len: int, max_new: int, budget: int) -> int:
    """Draft KV slots a request needs (the module docstring's first inequality)."""
    return prompt_len + max_new + SLOTS_PER_NODE * budget + SLOT_MARGIN


def settle_draft(tree: TreeParams, capacity: int, prompt_len: int, max_new: int) -> TreeParams:
    """``tree`` with an auto budget shrunk to the draft's context; ContextFullError if it cannot fit."""
    if tree.auto_budget:
        room = (capacity - prompt_len - max_new - SLOT_MARGIN) // SLOTS_PER_NODE
        tree = replace(tree, budget=max(1, min(tree.budget, room)))
    need = draft_need(prompt_len, max_new, tree.budget)
    if need > capacity:
        raise ContextFullError(f"prompt ({prompt_len}) + max tokens ({max_new}) + tree slots need a draft "
                               f"context of {need}, the engine has {capacity}")
    return tree


def settle_cloud(tree: TreeParams, ready: Ready, prompt_len: int, max_new: int, drafting: bool,
              fit: bool = False) -> tuple[TreeParams, int]:
    """(the session's tree, the max_new to generate) from the cloud's ``Ready``. With ``fit``,
    ``max_new`` is only an upper bound: it becomes ``min(max_new, capacity − len(prompt) − budget)``."""
    tree = tree.for_cloud(ready.max_nodes, ready.flat_nodes)
    if drafting and ready.max_nodes < tree.budget:
        raise CloudError("limits", f"tree budget {tree.budget} exceeds the cloud's limit of "
                                   f"{ready.max_nodes} nodes per tree; lower --budget")
    nodes = tree.budget if drafting else 0
    if fit:
        max_new = min(max_new, ready.capacity - prompt_len - nodes)
    need = prompt_len + max(max_new, 1) + nodes
    if need > ready.capacity:
        raise ContextFullError(f"prompt ({prompt_len}) + max tokens ({max_new}) + tree nodes need a cloud "
                               f"context of {need}, the cloud has {ready.capacity}")
    return tree, max_new


def default_max_tokens(capacity: int, prompt_len: int, tree: TreeParams) -> int:
    """Tokens a request without ``max_tokens`` may generate in the draft's context (module docstring)."""
    nodes = min(tree.budget, RESERVED_AUTO_NODES) if tree.auto_budget else tree.budget
    room = capacity - draft_need(prompt_len, 0, nodes)
    if room < 1:
        raise ContextFullError(f"the prompt ({prompt_len} tokens) leaves no room to generate in the draft's "
                               f"context of {capacity}")
    return room
