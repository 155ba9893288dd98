"""Token-tree geometry shared by the edge and the cloud: ROOT, depths, positions, attention masks.

A tree is given by ``parents`` (``parents[j] < j``; ``ROOT`` = -1 for a child of the implicit
root, the last committed token). ``allowed[i, j]`` is True when new token ``i`` may attend to KV
slot ``j``; slots ``≥ kv_len`` are the new tokens themselves (row ``r`` sits at ``kv_len + r``).

``ancestor_mask`` is the one tree-mask builder: the drafter feeds nodes whose ancestors sit at
scattered draft-KV slots; the target feeds ``[root] + nodes`` contiguously; the export's parity
check feeds a whole tree after a prefix. ``causal_allowed`` is its chain case (each token's
ancestors are the tokens before it), written with ``np.tril`` because prompts are long.

numpy only: no torch, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

ROOT = -1


def child_with(tokens: Sequence[int], parents: Sequence[int], parent: int, token: int) -> int | None:
    """The first node whose parent is ``parent`` (-1 = root) and whose token is ``token``, or None:
    the one walk acceptance, the cloud's sequential verify and the edge's verdict plan share."""
    return next((j for j, (t, p) in enumerate(zip(tokens, parents, strict=True)) if p == parent and t == token),
                None)


def tree_depths(parents: Sequence[int]) -> list[int]:
    """Depth of every node ``[N]``: 1 for a child of the root, parent's depth + 1 otherwise."""
    depth: list[int] = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return depth


def node_positions(depths: Sequence[int], root_position: int) -> list[int]:
    """Absolute positions: the root sits at ``root_position``, a node at root_position + depth."""
    return [root_position + d for d in depths]


def ancestor_mask(parents: Sequence[int], rows: Sequence[int], slots: Sequence[int], kv_len: int,
                  see: int | None = None) -> np.ndarray:
    """Bool ``[T, kv_len + T]`` for feeding the tree nodes ``rows`` (T = len(rows); ROOT may be one).

    Row ``r`` sees KV slots ``[0, see)`` (default ``kv_len``: the whole cache), for every ancestor
    ``a`` of ``rows[r]`` its slot ``slots[a]`` when fed (``≥ 0``), else its own row when ``a`` is
    fed in this step before ``r`` (``kv_len + rows.index(a)``: a path of unfed nodes, a prompt-
    lookup chain, goes in one forward), and itself (``kv_len + r``). Parents must point backwards
    (``parents[j] < j``); an ancestor neither fed nor an earlier row is a ValueError.
    """
    t = len(rows)
    allowed = np.zeros((t, kv_len + t), dtype=bool)
    allowed[:, : kv_len if see is None else see] = True
    row_of = {node: r for r, node in enumerate(rows)}
    for r, i in enumerate(rows):
        child, a = i, (ROOT if i == ROOT else parents[i])
        while a != ROOT:
            if a >= child:
                raise ValueError(f"parent {a} of node {child} must come before it")
            if slots[a] >= 0:
                allowed[r, slots[a]] = True
            elif row_of.get(a, r) < r:
                allowed[r, kv_len + row_of[a]] = True
            else:
                raise ValueError(f"ancestor {a} of node {i} has not been fed (nor is it an earlier row)")
            child, a = a, parents[a]
        allowed[r, kv_len + r] = True
    return allowed


def causal_allowed(kv_len: int, t: int) -> np.ndarray:
    """[t, kv_len + t]: each new token sees the whole cache and the new tokens before it."""
    allowed = np.ones((t, kv_len + t), dtype=bool)
    allowed[:, kv_len:] = np.tril(np.ones((t, t), dtype=bool))
    return allowed
