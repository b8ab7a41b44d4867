"""`python -m benchmarks.own_checkpointing`: a model that checkpoints its own blocks.

Users whose model does not fit often have activation checkpointing on already
(`torch.utils.checkpoint` around each block, as transformers' gradient checkpointing
does). memplan takes that step as written as its unplanned step (docs/pipeline.md,
"lower"), and is free to recompute otherwise within the budget. Six blocks of two layers
(width 512, batch 2048), each checkpointed, the loss inside; measured on the CPU:

- eager, as written, and eager without the checkpointing;
- torch.compile's default (Inductor), as written;
- `backend=memplan.backend(budget=...)` with Inductor at 100%, 80% and 60% of its
  unplanned step and at its least (a 1-byte budget, best effort).

Peak: the allocator's, of a steady step (`memplan.tools.verify.steady_step_peak`). Step
time: the median of 5 steps after two warm-ups. Gradients: the largest absolute difference
from eager's. Writes benchmarks/results/own-checkpointing-<device>.json and its section
of docs/results.md.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any

import torch
from rich.progress import track
from torch import nn
from torch.utils.checkpoint import checkpoint

import memplan
from benchmarks.blocks import Block
from benchmarks.models import machine
from benchmarks.pages import ResultsSection
from memplan.core.errors import MemplanWarning
from memplan.core.units import format_bytes
from memplan.planner.measure import median_step_seconds
from memplan.tools.verify import steady_step_peak, training_step

BLOCKS, WIDTH, BATCH = 6, 512, 2048
# memplan's budgets: shares of its unplanned step, and its least (1 byte, best effort).
BUDGETS = ("100%", "80%", "60%", "1 B")
CPU = torch.device("cpu")


class CheckpointedBlocks(nn.Module):
    """BLOCKS blocks, each recomputed in the backward where `checkpointed`; the loss inside."""

    def __init__(self, checkpointed: bool = True) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(WIDTH) for _ in range(BLOCKS))
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return x.square().mean()


def _measured(
    label: str, run: nn.Module, model: nn.Module, inputs: tuple[torch.Tensor, ...]
) -> dict[str, Any]:
    """`run`'s (training `model`) allocator peak, step time and gradients' largest
    difference from eager's (of the model as written, from the same weights)."""
    eager = copy.deepcopy(model)
    training_step(eager, inputs)()
    peak = steady_step_peak(run, model, inputs)  # leaves its step's gradients
    error = max(
        (a.grad - b.grad).abs().max().item()
        for a, b in zip(model.parameters(), eager.parameters(), strict=True)
        if a.grad is not None and b.grad is not None
    )
    seconds = median_step_seconds(training_step(run, inputs), device=CPU)
    return {"run": label, "peak": peak, "step_seconds": seconds, "max_grad_error": error}


def measure() -> dict[str, Any]:
    torch.manual_seed(0)
    model, inputs = CheckpointedBlocks(), (torch.randn(BATCH, WIDTH),)
    plain = CheckpointedBlocks(checkpointed=False)
    plain.load_state_dict(model.state_dict())
    rows = [
        _measured("eager, as written", model, model, inputs),
        _measured("eager, without checkpointing", plain, plain, inputs),
    ]
    torch._dynamo.reset()
    compiled_model = copy.deepcopy(model)
    rows.append(_measured("torch.compile", torch.compile(compiled_model), compiled_model, inputs))
    for budget in track(BUDGETS, description="memplan"):
        rows.append(_memplan(budget, model, inputs))
    return {"machine": machine("cpu"), "sizes": [BLOCKS, WIDTH, BATCH], "rows": rows}


def _memplan(budget: str, model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    torch._dynamo.reset()
    planned = copy.deepcopy(model)
    backend = memplan.backend(budget=budget, progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemplanWarning)  # the least: "infeasible", as asked
        row = _measured(
            f"memplan {'least' if budget == '1 B' else budget}",
            torch.compile(planned, backend=backend),
            planned,
            inputs,
        )
    (plan,) = backend.plans
    return {
        **row,
        "unplanned_peak": plan.unplanned_peak,
        "budget": plan.asked,
        "predicted_peak": plan.peak,
        "recomputed": plan.counts()["recompute"],
        "plan": "as written" if plan.solver == "as_written" else plan.solver,
    }


def section_text(saved: dict[str, Any]) -> str:
    """The section of docs/results.md."""
    where = saved["machine"]
    blocks, width, batch = saved["sizes"]
    rows = saved["rows"]
    eager = rows[0]
    lines = [
        "## A model that checkpoints its own blocks",
        "",
        f"Written by `python -m benchmarks.own_checkpointing` ({where['date']}, "
        f"{where['device_name']}, {where['cpu_threads']} threads, torch {where['torch']}): "
        f"{blocks} blocks of two layers (width {width}, batch {batch}), each wrapped in "
        "`torch.utils.checkpoint`. memplan's unplanned step is the step as written (the "
        "checkpointed blocks recomputed), simulated on the unfused graph; its budgets are "
        "shares of it, and its least a 1-byte budget planned best effort. Peak: the "
        "allocator's, of a steady step; step time: the median of 5 steps. Plan: the "
        "solver whose plan was kept, or the step as written, which the backend compiles "
        "as one more round where no other holds the budget (the written lane, compile/search.py).",
        "",
        "| run | budget | plan | predicted peak | measured peak | vs eager | step time | "
        "vs eager | recomputed | max grad error |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        planned = "budget" in r
        lines.append(
            f"| {r['run']} | {format_bytes(r['budget']) if planned else ''} | "
            f"{r.get('plan', '')} | {format_bytes(r['predicted_peak']) if planned else ''} | "
            f"{format_bytes(r['peak'])} | {r['peak'] / eager['peak']:.2f} | "
            f"{r['step_seconds'] * 1e3:.1f} ms | {r['step_seconds'] / eager['step_seconds']:.2f} | "
            f"{r['recomputed'] if planned else ''} | {r['max_grad_error']:.1e} |"
        )
    return "\n".join(lines) + "\n"


SECTION = ResultsSection("own checkpointing", __doc__.splitlines()[0], measure, section_text)


if __name__ == "__main__":
    raise SystemExit(SECTION.main())
