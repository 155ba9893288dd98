"""Preallocated KV cache indexed by position (gpt-fast style), shared by draft and target.

Keys and values live in two buffers ``[layers, kv_heads, capacity, head_dim]``; ``length``
entries are valid. Every operation the speculative loop needs is a pointer move or a copy of
only the entries that move:

- ``truncate(n)``: rollback / boundary restore — sets ``length = n`` (O(1)).
- ``compact(src, dst_start)``: move entries ``src`` (e.g. an accepted tree path) to
  ``dst_start, dst_start+1, …`` and set ``length = dst_start + len(src)`` (O(moved)).

During a forward, each layer writes its T new entries at ``[length, length+T)`` and attends over
``[0, length+T)``; ``commit(T)`` then advances ``length``. A forward that fails leaves
``length`` unchanged, so nothing is half-applied.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from rapid.core.errors import ContextFullError


class StaticKV:
    """``KVStore`` over preallocated buffers; see the module docstring."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> None:
        shape = (layers, kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, KVH, cap, d]
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.length = 0
        self._pending = 0

    @classmethod
    def for_config(cls, c, capacity: int, dtype: torch.dtype, device="cpu") -> StaticKV:
        return cls(c.num_layers, c.num_kv_heads, c.head_dim, capacity, dtype, device)

    def begin(self, t: int) -> None:
        """Reserve room for ``t`` new entries of the coming forward."""
        if self.length + t > self.capacity:
            raise ContextFullError(f"KV cache full: {self.length} + {t} > capacity {self.capacity}")
        self._pending = t

    def attend_kv(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor):
        t = k_new.shape[2]
        if t != self._pending:
            raise RuntimeError("StaticKV.begin(t) must precede a forward of t tokens")
        end = self.length + t
        self.k[layer, :, self.length:end] = k_new[0]
        self.v[layer, :, self.length:end] = v_new[0]
        return self.k[layer, :, :end][None], self.v[layer, :, :end][None]

    def commit(self, t: int) -> None:
        self.length += t
        self._pending = 0

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"truncate({length}) outside [0, {self.length}]")
        self.length = length

    def compact(self, src: Sequence[int], dst_start: int) -> None:
        """Move entries ``src`` to ``dst_start…``; afterwards ``length = dst_start + len(src)``."""
        n = len(src)
        if n and (min(src) < 0 or max(src) >= self.length):
            raise ValueError(f"compact: source slots {list(src)} outside [0, {self.length})")
        if not 0 <= dst_start <= self.length:
            raise ValueError(f"compact: dst_start {dst_start} outside [0, {self.length}]")
        if dst_start + n > self.capacity:
            raise ValueError(f"compact: {n} entries from {dst_start} exceed capacity {self.capacity}")
        if n and list(src) != list(range(dst_start, dst_start + n)):
            idx = torch.as_tensor(list(src), dtype=torch.long, device=self.k.device)
            # Advanced indexing on the right makes a copy first, so overlapping moves are safe.
            self.k[:, :, dst_start:dst_start + n] = self.k[:, :, idx]
            self.v[:, :, dst_start:dst_start + n] = self.v[:, :, idx]
        self.length = dst_start + n
