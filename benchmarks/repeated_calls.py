"""`python -m benchmarks.repeated_calls`: a graph called again before its backward.

Two ways users call one compiled graph more than once before one backward, each under one
memplan backend (memplan/compile/runner.py):

- siamese: an encoder (6 layers of width 256 and a projection to 16, batch 2048) compiled
  on its own and called on two inputs, the loss the mean of the embeddings' product, at
  absolute budgets of 80, 70, 60 and 50% of eager's step peak;
- regional: six blocks of two layers (width 256, batch 2048), each compiled alone
  (`block.compile(backend=...)`), at 70% of the step's unplanned peak.

Step 1 compiles the graphs and is checked (a warning is expected; the step's later calls
then run the least-memory plan), step 2 plans them again for what earlier calls held, and
the allocator reads steps 1 and 3. Step 1's compiles run inside the allocator's recording,
where they cannot read the allocator themselves (a second torch.profiler session cannot
start inside the first): its plans are not checked as Inductor compiled them, their peaks
are the unfused graphs' predictions, and a user's first step can plan otherwise. Writes
benchmarks/results/repeated-calls-<device>.json and its section of docs/results.md.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import torch
from rich.progress import track
from torch import nn

import memplan
from benchmarks.blocks import Block
from benchmarks.models import machine
from benchmarks.pages import ResultsSection
from memplan.core.errors import MemplanWarning
from memplan.core.units import format_bytes
from memplan.planner.measure import measure_peak

SIAMESE_SHARES = (0.8, 0.7, 0.6, 0.5)
REGIONAL_BUDGET = "70%"
WIDTH, BATCH = 256, 2048
CPU = torch.device("cpu")


def siamese_model() -> nn.Module:
    layers = [m for _ in range(6) for m in (nn.Linear(WIDTH, WIDTH), nn.GELU())]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 16))


class Blocks(nn.Module):
    """Six blocks, the loss inside, so that only the blocks are compiled."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(WIDTH) for _ in range(6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x.square().mean()


def _peak(step: Callable[[], None], model: nn.Module, inputs: list[torch.Tensor]) -> int:
    return measure_peak(step, resident=[*model.parameters(), *inputs], device=CPU).peak_bytes


def _three_steps(
    step: Callable[[], None], model: nn.Module, inputs: list[torch.Tensor]
) -> tuple[bool, int, int]:
    """Whether step 1 warned of what earlier calls held, and the allocator peaks of step 1
    (the compiles in it included: what a user's first step takes) and step 3."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        first = _peak(step, model, inputs)
    warned = any("ran while earlier calls" in str(w.message) for w in said)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemplanWarning)  # a budget under the least says so
        step()
        return warned, first, _peak(step, model, inputs)


def _plans(backend: memplan.compile.backend.MemplanBackend) -> list[dict[str, Any]]:
    return [
        {
            "name": p.name,
            "status": p.status,
            "recomputed": p.counts()["recompute"],
            "resident": p.resident,
            "peak": p.peak,
        }
        for p in backend.plans
    ]


def siamese(share: float) -> dict[str, Any]:
    """The encoder called twice per step at `share` of eager's step peak."""
    torch.manual_seed(0)
    encoder = siamese_model()
    inputs = [torch.randn(BATCH, WIDTH), torch.randn(BATCH, WIDTH)]

    def step_of(model: nn.Module) -> Callable[[], None]:
        def step() -> None:
            model.zero_grad(set_to_none=True)
            (model(inputs[0]) * model(inputs[1])).mean().backward()

        return step

    step_of(encoder)()
    eager = _peak(step_of(encoder), encoder, inputs)
    budget = int(share * eager)
    torch._dynamo.reset()
    model = copy.deepcopy(encoder)
    backend = memplan.backend(budget=budget, progress=False)
    compiled = torch.compile(model, backend=backend)
    warned, first, peak = _three_steps(step_of(compiled), model, inputs)
    return {"case": f"siamese {share:.0%}", "eager": eager, "budget": budget, "warned": warned,
            "step1_peak": first, "peak": peak, "plans": _plans(backend)}  # fmt: skip


def regional() -> dict[str, Any]:
    """Each of six blocks compiled alone, at REGIONAL_BUDGET of the step's unplanned peak."""
    torch.manual_seed(0)
    eager_model, inputs = Blocks(), [torch.randn(BATCH, WIDTH)]

    def step_of(model: nn.Module) -> Callable[[], None]:
        def step() -> None:
            model.zero_grad(set_to_none=True)
            model(*inputs).backward()

        return step

    step_of(eager_model)()
    eager = _peak(step_of(eager_model), eager_model, inputs)
    torch._dynamo.reset()
    model = copy.deepcopy(eager_model)
    backend = memplan.backend(budget=REGIONAL_BUDGET, progress=False)
    for block in model.blocks:
        block.compile(backend=backend)
    warned, first, peak = _three_steps(step_of(model), model, inputs)
    kept = backend.plans[-1]
    return {"case": f"regional {REGIONAL_BUDGET}", "eager": eager,
            "budget": kept.step_budget, "warned": warned, "step1_peak": first,
            "peak": peak, "plans": _plans(backend)}  # fmt: skip


def section_text(saved: dict[str, Any]) -> str:
    """The section of docs/results.md."""
    where = saved["machine"]
    lines = [
        "## A graph called again before its backward",
        "",
        f"Written by `python -m benchmarks.repeated_calls` ({where['date']}, "
        f"{where['device_name']}, {where['cpu_threads']} threads, torch {where['torch']}): "
        "one compiled graph called more than once before one backward, under memplan's "
        "backend with Inductor ([pipeline](pipeline.md)). Step 1 compiles the graph and "
        "warns, and its later calls run the graph's least-memory plan; step 2 plans the "
        "graph again for what the earlier calls held. The allocator reads step 1 (its "
        "compiles included, whose plans are then not checked as Inductor compiled them: "
        "inside the allocator's recording they cannot read it) and step 3. "
        "Budget: the step's (for regional compilation, the last graph's plan's with what it "
        "was planned to have resident). Plans: each plan's recomputed tensors, with the "
        "bytes it was planned to have resident.",
        "",
        "| case | eager | budget | step 1 warned | step 1 peak | step 3 peak | within | plans |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in saved["rows"]:
        plans = "; ".join(
            f"{p['name']}: {p['recomputed']} recomputed, {format_bytes(p['resident'])} resident"
            for p in r["plans"]
        )
        lines.append(
            f"| {r['case']} | {format_bytes(r['eager'])} | {format_bytes(r['budget'])} | "
            f"{'yes' if r['warned'] else 'no'} | {format_bytes(r['step1_peak'])} | "
            f"{format_bytes(r['peak'])} | "
            f"{'yes' if r['peak'] <= r['budget'] else 'no'} | {plans} |"
        )
    return "\n".join(lines) + "\n"


def measure() -> dict[str, Any]:
    rows = [siamese(share) for share in track(SIAMESE_SHARES, description="siamese")]
    rows.append(regional())
    return {"machine": machine("cpu"), "rows": rows}


SECTION = ResultsSection("repeated calls", __doc__.splitlines()[0], measure, section_text)


if __name__ == "__main__":
    raise SystemExit(SECTION.main())
