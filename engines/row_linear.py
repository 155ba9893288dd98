"""The PyTorch draft's projections on the row kernels (``rapid.engines.rowops``), on a CPU.

torch's CPU GEMM handles a step of a few rows badly: past one row it packs the weight on every
call, so a draft step of 2-8 tree rows costs 2-3x a one-row step. Measured on an AVX2 Zen 3, one
thread, float32, the 0.5B draft's shapes (ms per call):

    | shape             | M=1       | M=2       | M=8        | M=128       |
    | 896 -> 4864       | 1.5 / 1.2 | 2.7 / 0.8 | 4.7 / 2.3  | 22.8 / 19.9 |
    | LM head -> 151936 | 43 / 30   | 85 / 31   | 123 / 48   | 719 / 695   |
    (torch F.linear / rowops.linear)

and a whole draft step went from 138 ms (T=1) to 286 ms (T=2) and 408 ms (T=8). The row
kernels stream the weight once for all rows, so a tree step costs about a one-row step until
the compute bound. They are faster at every M measured, prefill included, so every projection
uses them and the torch weight is dropped (an embedding tied to the LM head stays, packed
twice).

Speed only: the draft's numbers decide what is proposed, never what is emitted.
"""

from __future__ import annotations

import torch
from torch import nn

from rapid.engines import rowops


class RowLinear(nn.Module):
    """``nn.Linear`` over a packed weight: ``y = x wᵀ + b`` in float32, returned in ``x``'s dtype."""

    def __init__(self, lin: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self.packed = rowops.pack(lin.weight.detach())
        self.bias_f32 = None if lin.bias is None else lin.bias.detach().float().contiguous()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features).float().contiguous()
        y = rowops.linear(rows, self.packed, self.bias_f32, torch.get_num_threads())
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)


def use_row_linears(model: nn.Module) -> int:
    """Replace every ``nn.Linear`` of ``model`` (a CPU model) by a :class:`RowLinear`; return how
    many. Raises ``rowops.RowOpsUnavailable`` where the kernels are not built."""
    found = [(parent, name, child) for parent in model.modules()
             for name, child in parent.named_children() if isinstance(child, nn.Linear)]
    for parent, name, child in found:
        setattr(parent, name, RowLinear(child))
    return len(found)
