"""Boolean attention matrices shared by the edge and the cloud (numpy only, no torch).

``allowed[i, j]`` is True when new token ``i`` may attend to KV slot ``j``; slots ``≥ kv_len``
are the new tokens themselves. Tree masks are built by ``runtime.tree.tree_attention`` (edge)
and ``server.target.verify_attention`` (cloud).
"""

from __future__ import annotations

import numpy as np


def causal_allowed(kv_len: int, t: int) -> np.ndarray:
    """[t, kv_len + t]: each new token sees the whole cache and the new tokens before it."""
    allowed = np.ones((t, kv_len + t), dtype=bool)
    allowed[:, kv_len:] = np.tril(np.ones((t, t), dtype=bool))
    return allowed
