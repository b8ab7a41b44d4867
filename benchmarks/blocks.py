"""The blocks the benchmarks of blocks share: two layers with GELUs, a module of its own
(Dynamo skips a bare nn.Sequential compiled alone), parts of checkpointed blocks with
graph breaks between them, and layers followed, after a graph break, by a head of large
parameters."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    """Two layers of `width` with GELUs."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.gelu(self.second(nn.functional.gelu(self.first(x))))


class CheckpointedParts(nn.Module):
    """Two or four parts of `blocks` blocks each, every block checkpointed, with a graph
    break between each two parts, and a 10-class head with the loss inside."""

    def __init__(self, parts: int = 2, width: int = 256, blocks: int = 3) -> None:
        super().__init__()
        if parts not in (2, 4):
            raise ValueError(f"CheckpointedParts has 2 or 4 parts, not {parts}")
        self.parts = nn.ModuleList(
            nn.ModuleList(Block(width) for _ in range(blocks)) for _ in range(parts)
        )
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        # Written out: a graph break inside a loop makes Dynamo run the whole frame eagerly.
        x = self.part(0, x)
        torch._dynamo.graph_break()
        x = self.part(1, x)
        if len(self.parts) == 4:
            torch._dynamo.graph_break()
            x = self.part(2, x)
            torch._dynamo.graph_break()
            x = self.part(3, x)
        return nn.functional.cross_entropy(self.head(x), target)

    def part(self, index: int, x: torch.Tensor) -> torch.Tensor:
        for block in self.parts[index]:
            x = checkpoint(block, x, use_reentrant=False)
        return x


def checkpointed_parts(parts: int) -> tuple[CheckpointedParts, tuple[torch.Tensor, torch.Tensor]]:
    """CheckpointedParts(parts) with a batch of 2048 rows of width 256 and their classes,
    from seed 0: the model benchmarks/graph_breaks.py and the graph-break tests share."""
    torch.manual_seed(0)
    model = CheckpointedParts(parts)
    return model, (torch.randn(2048, 256), torch.randint(0, 10, (2048,)))


class LargeHead(nn.Module):
    """Four layers of width 256 with GELUs, a graph break, and a head whose parameters (a
    layer of width 4096, 4 MiB) are large against what it computes (on eight rows of the
    batch): while the first graph runs, the step holds them, and from its backward on,
    their gradients."""

    def __init__(self, layers: int = 4, width: int = 256, head: int = 4096) -> None:
        super().__init__()
        self.layers = nn.Sequential(
            *(nn.Sequential(nn.Linear(width, width), nn.GELU()) for _ in range(layers))
        )
        self.wide, self.out = nn.Linear(width, head), nn.Linear(head, 10)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        x = self.layers(x)
        torch._dynamo.graph_break()
        return nn.functional.cross_entropy(self.out(self.wide(x[:8])), target)


def large_head() -> tuple[LargeHead, tuple[torch.Tensor, torch.Tensor]]:
    """LargeHead with a batch of 4096 rows of width 256 and eight rows' classes, from
    seed 0."""
    torch.manual_seed(0)
    return LargeHead(), (torch.randn(4096, 256), torch.randint(0, 10, (8,)))
