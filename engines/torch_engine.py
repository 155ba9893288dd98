"""PyTorch draft backend: ``rapid.modeling.Decoder`` over a ``StaticKV`` cache."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from rapid.engines.base import EngineInfo, ReadyHandle, step_inputs
from rapid.kvcache import StaticKV
from rapid.modeling import Decoder, additive_mask


class TorchEngine:
    """Synchronous on CPU; on CUDA each step records an event and ``ready()`` queries it."""

    def __init__(self, model: Decoder, capacity: int = 2048, device: str = "cpu") -> None:
        c = model.config
        self.model = model.to(device)
        self.device = torch.device(device)
        self.kv = StaticKV.for_config(c, capacity, model.dtype, device)
        self.info = EngineInfo("torch", str(self.device), c.vocab_size, capacity, c.eos_token_ids)

    @property
    def kv_len(self) -> int:
        return self.kv.length

    def step(self, tokens: Sequence[int], positions: Sequence[int], allowed: np.ndarray,
             rows: Sequence[int] | None = None):
        inp = step_inputs(self.kv.length, self.info.capacity, tokens, positions, allowed,
                          vocab=self.info.vocab_size, rows=rows)
        t, dev = len(inp.ids), self.device
        ids = torch.as_tensor(inp.ids, device=dev)[None]
        pos = torch.as_tensor(inp.pos, device=dev)[None]
        mask = additive_mask(torch.as_tensor(inp.allowed, device=dev), self.model.dtype)
        sel = None if inp.rows is None else torch.as_tensor(inp.rows, device=dev)
        self.kv.begin(t)
        with torch.inference_mode():
            logits = self.model(ids, pos, mask, self.kv, sel)[0]
        self.kv.commit(t)
        if dev.type == "cuda":
            return _CudaHandle(logits)
        return ReadyHandle(logits.float().numpy())

    def truncate(self, length: int) -> None:
        self.kv.truncate(length)

    def compact(self, src_slots: Sequence[int], dst_start: int) -> None:
        self.kv.compact(src_slots, dst_start)

    def reset(self) -> None:
        self.kv.truncate(0)


class _CudaHandle:
    """A step queued on the current CUDA stream; an event marks its completion."""

    def __init__(self, logits: torch.Tensor) -> None:
        self._logits = logits
        self._event = torch.cuda.Event()
        self._event.record()

    def ready(self) -> bool:
        return self._event.query()

    def logits(self) -> np.ndarray:
        self._event.synchronize()
        return self._logits.float().cpu().numpy()
