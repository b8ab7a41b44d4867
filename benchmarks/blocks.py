"""The block the benchmarks of blocks share: two layers with GELUs, a module of its own
(Dynamo skips a bare nn.Sequential compiled alone)."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    """Two layers of `width` with GELUs."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(self.second(nn.functional.gelu(self.first(x))))
