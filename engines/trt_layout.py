"""Where the TensorRT backend's per-layer KV bindings live, and what all its buffers cost.

TensorRT requires every bound address to be 256-byte aligned (``IExecutionContext::
setTensorAddress``: "The pointer must have at least 256-byte alignment"). A step binds, for each
layer i, ``past_key_i`` / ``past_value_i`` ``[1, kvh, P, hd]`` (read from a staging buffer) and
``present_key_i`` / ``present_value_i`` ``[1, kvh, T, hd]`` (written to a presents buffer). The
layers of one kind share one buffer; packing them back to back puts layer i at
``base + i·kvh·n·hd·s``, which is 256-aligned only when ``kvh·n·hd·s`` is a multiple of 256 —
not, e.g., for the tiny fp32 test model (kvh·hd·s = 128) at odd n. So each layer gets a block
of whole head rows whose size is a multiple of 256 bytes:

    pitch(n)  = n · hd · s                         bytes of one head's n entries (s = itemsize)
    q(n)      = 256 / gcd(256, pitch(n))           fewest rows whose bytes are a multiple of 256
    height(n) = ceil(kvh / q(n)) · q(n)            rows reserved per layer (kvh used, the rest padding)
    stride(n) = pitch(n) · height(n)               ≡ 0 (mod 256); layer i starts at base + i·stride(n)

Inside a block the kvh head rows are packed (the bound tensor is contiguous). Because the layer
stride is a whole number of rows, the cache ↔ block move stays ONE 3-D copy per buffer (depth =
layers, height = kvh, width = pitch(n); slice height C-side = kvh, block-side = height(n)). For
the default draft (kvh = 2, hd = 64, fp16: pitch = 128·n) height(n) = kvh for every n, so the
padding costs nothing; in the worst case it at most doubles a staging block.

:func:`plan` is the whole device and pinned-host footprint the engine allocates (it allocates
exactly these sizes); ``docs/engines.md`` works it through for the default 0.5B draft.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

ALIGN = 256  # bytes: TensorRT's binding alignment, and cudaMalloc's guarantee
SLOTS = 2  # pinned I/O slots: a handle stays valid while the next step is queued


def round_up(n: int, a: int = ALIGN) -> int:
    return -(-int(n) // a) * a


@dataclass(slots=True, frozen=True)
class BlockLayout:
    """Per-layer blocks of one step binding kind (past or present) for n entries."""

    pitch: int  # bytes of one head row: n · hd · s
    height: int  # rows per layer block (>= kv_heads)

    @property
    def stride(self) -> int:
        """Bytes between layer i and layer i+1 (a multiple of ALIGN)."""
        return self.pitch * self.height

    def offset(self, layer: int) -> int:
        return layer * self.stride


def block_layout(n: int, kv_heads: int, head_dim: int, itemsize: int) -> BlockLayout:
    """Layout of ``[kv_heads, n, head_dim]`` blocks, one per layer, each 256-byte aligned."""
    pitch = int(n) * int(head_dim) * int(itemsize)
    if pitch == 0:  # empty tensors (P = 0): every layer at the (aligned) base
        return BlockLayout(0, int(kv_heads))
    q = ALIGN // math.gcd(ALIGN, pitch)
    return BlockLayout(pitch, -(-int(kv_heads) // q) * q)


def blocks_bytes(n_max: int, layers: int, kv_heads: int, head_dim: int, itemsize: int) -> int:
    """Bytes a buffer needs to hold ``layers`` blocks for every n in [0, n_max]."""
    return max(layers * block_layout(n, kv_heads, head_dim, itemsize).stride for n in range(n_max + 1))


@dataclass(slots=True, frozen=True)
class MemoryPlan:
    """Bytes of each buffer the TensorRT engine allocates (device ones rounded up to ALIGN).

    Device, allocated twice (K and V, or ids and positions): ``kv`` the cache ``[L·kvh, C, hd]``;
    ``stage`` the past blocks for any P <= C (also the snapshot area of a general compaction);
    ``present`` the new-entry blocks for any T <= chunk; ``index`` ids / positions ``[chunk]``
    int64. Once: ``mask`` ``[chunk, C]`` and ``logits`` ``[chunk, V]`` (TensorRT writes every row
    of a step). Pinned host, per slot: ids, positions, mask and the logits of at most
    ``rows_cap`` rows (only requested rows are downloaded). TensorRT's activation scratch (one
    block shared by every context) and the weights come on top.
    """

    kv: int
    stage: int
    present: int
    index: int
    mask: int
    logits: int
    pinned_slot: int

    @property
    def device(self) -> int:
        return 2 * (self.kv + self.stage + self.present + self.index) + self.mask + self.logits

    @property
    def pinned(self) -> int:
        return SLOTS * self.pinned_slot


def plan(layers: int, kv_heads: int, head_dim: int, vocab: int, capacity: int, chunk: int,
         rows_cap: int, itemsize: int) -> MemoryPlan:
    """The footprint for a model shape, cache capacity C, step chunk and downloaded-rows cap."""
    per = (layers, kv_heads, head_dim, itemsize)
    return MemoryPlan(
        kv=round_up(layers * kv_heads * capacity * head_dim * itemsize),
        stage=round_up(blocks_bytes(capacity, *per)),
        present=round_up(blocks_bytes(chunk, *per)),
        index=round_up(chunk * 8),
        mask=round_up(chunk * capacity * itemsize),
        logits=round_up(chunk * vocab * itemsize),
        pinned_slot=2 * chunk * 8 + chunk * capacity * itemsize + rows_cap * vocab * itemsize,
    )
