"""`python -m benchmarks.graph_breaks`: one budget for a step Dynamo compiles as several graphs.

Models whose forward Dynamo splits into graphs, each under one memplan backend with
Inductor at 100% and 80% of the step's unplanned peak (memplan/compile/room.py: the graphs
before a graph left under its least make room for it at the next step):

- two halves of three checkpointed blocks (width 256, batch 2048) with a graph break
  between them, the loss inside (`benchmarks.blocks.checkpointed_parts`);
- four such parts, three breaks;
- transformers' GPT-2 (4 layers, width 128, batch 8, sequence 128) with its own gradient
  checkpointing (`use_reentrant=False`), which Dynamo compiles as two graphs;
- four layers (width 256, batch 4096), a graph break, and a head of large parameters on
  eight rows (`benchmarks.blocks.large_head`): the step holds the head's parameters while
  the first graph runs, and their gradients in its backward.

Step 1 compiles and plans the graphs, and step 2 plans again where room is to be made
(and compiles what that changes): both run as a user runs them, outside the allocator's
recording. Inside it their compiles could not read the allocator (the profile's
transients, the check of Inductor's graphs: a second torch.profiler session cannot start
inside the first), and would plan otherwise. Step 1 is given by its prediction; the
allocator reads steps 3 and 4, which run what was kept. Against eager and torch.compile's
default, both as written. Step time: the median of 5 steps after step 4. Gradients: the
largest absolute difference from eager's.
Writes benchmarks/results/graph-breaks-<device>.json and its section of docs/results.md.
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
from benchmarks.blocks import checkpointed_parts, large_head
from benchmarks.models import machine
from benchmarks.pages import ResultsSection
from memplan.core.errors import MemplanWarning
from memplan.core.units import format_bytes
from memplan.planner.measure import measure_peak, median_step_seconds
from memplan.tools.verify import resident_tensors, steady_step_peak, training_step
from memplan.tools.zoo import ZOO

BUDGETS = ("100%", "80%")
MEASURED_STEPS = 2  # steps 3 and 4
CPU = torch.device("cpu")


def _gpt2() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    example = ZOO["gpt2"](batch=8, seq=128, layers=4, width=128)
    with warnings.catch_warnings():  # renamed activation_checkpointing_enable in 5.x
        warnings.simplefilter("ignore", FutureWarning)
        example.model.model.gradient_checkpointing_enable(
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )
    return example.model, tuple(example.inputs)


CASES: dict[str, Callable[[], tuple[nn.Module, tuple[torch.Tensor, ...]]]] = {
    "two checkpointed halves": lambda: checkpointed_parts(2),
    "four checkpointed parts": lambda: checkpointed_parts(4),
    "GPT-2, gradient checkpointing": _gpt2,
    "a head of large parameters": large_head,
}


def grad_error(model: nn.Module, eager: nn.Module) -> float:
    """The largest absolute difference of `model`'s gradients from `eager`'s."""
    return max(
        (a.grad - b.grad).abs().max().item()
        for a, b in zip(model.parameters(), eager.parameters(), strict=True)
        if a.grad is not None and b.grad is not None
    )


def _as_written(label: str, run: nn.Module, model: nn.Module, inputs: tuple) -> dict[str, Any]:
    peak = steady_step_peak(run, model, inputs)
    seconds = median_step_seconds(training_step(run, inputs), device=CPU)
    return {"run": label, "peak": peak, "step_seconds": seconds}


def _memplan(budget: str, model: nn.Module, inputs: tuple, eager: nn.Module) -> dict[str, Any]:
    """`model` compiled with memplan at `budget`: steps 1 and 2 run as a user runs them,
    steps 3 and 4 read by the allocator; the step's prediction after step 1 and now, the
    warnings given and the plans kept."""
    torch._dynamo.reset()
    planned = copy.deepcopy(model)
    backend = memplan.backend(budget=budget, progress=False)
    compiled = torch.compile(planned, backend=backend)
    step = training_step(compiled, inputs)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always", MemplanWarning)
        step()
        first = backend.predicted_step_peak
        step()
    resident = resident_tensors(planned, inputs)
    peaks = []
    for _ in range(MEASURED_STEPS):
        for param in planned.parameters():
            param.grad = None
        peaks.append(measure_peak(step, resident=resident, device=CPU).peak_bytes)
    error = grad_error(planned, eager)
    seconds = median_step_seconds(step, device=CPU)
    kept = list(backend.ledger.step.values())
    return {
        "run": f"memplan {budget}",
        "budget": max(p.step_budget for p in kept),
        "step1_predicted": first,
        "step_peaks": peaks,
        "peak": peaks[-1],
        "predicted_peak": backend.predicted_step_peak,
        "step_seconds": seconds,
        "max_grad_error": error,
        "room_made": any("leave it room" in str(w.message) for w in said),
        "plans": [
            {"name": p.name, "recomputed": p.counts()["recompute"], "held": p.held} for p in kept
        ],
    }


def measure_case(name: str) -> dict[str, Any]:
    model, inputs = CASES[name]()
    eager = copy.deepcopy(model)
    training_step(eager, inputs)()  # the gradients to compare with
    as_written = copy.deepcopy(model)
    runs = [_as_written("eager", as_written, as_written, inputs)]
    torch._dynamo.reset()
    default = copy.deepcopy(model)
    runs.append(_as_written("torch.compile", torch.compile(default), default, inputs))
    runs += [_memplan(budget, model, inputs, eager) for budget in BUDGETS]
    return {"case": name, "runs": runs}


def measure() -> dict[str, Any]:
    cases = [measure_case(name) for name in track(list(CASES), description="graph breaks")]
    return {"machine": machine("cpu"), "cases": cases}


def section_text(saved: dict[str, Any]) -> str:
    """The section of docs/results.md."""
    where = saved["machine"]
    lines = [
        "## One budget across graph breaks",
        "",
        f"Written by `python -m benchmarks.graph_breaks` ({where['date']}, "
        f"{where['device_name']}, {where['cpu_threads']} threads, torch {where['torch']}): "
        "models Dynamo compiles as several graphs, with their own checkpointing, under "
        "one memplan backend with Inductor at shares of the step's unplanned peak (the "
        "step as written, simulated on the unfused graphs). Where the graphs before a graph "
        "leave it under its least, they are planned again at step 2 to make room for it "
        "([pipeline](pipeline.md)). Step 1 (predicted): the step's prediction after step 1, "
        "whose compiles cannot be measured by the allocator without changing them "
        "(benchmarks/graph_breaks.py); steps 3, 4: the allocator's peaks; predicted: the "
        "step's, of the plans kept. Step time: the median of 5 "
        "steps, against torch.compile's: on a small shared CPU it moves between runs of the "
        "same plans by more than its differences here. Plans: the graphs' kept plans, with "
        "what each recomputes and holds for its backward.",
        "",
        "| case | run | budget | step 1 (predicted) | steps 3, 4 | predicted | within | "
        "room made | step time | vs torch.compile | plans | max grad error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in saved["cases"]:
        runs = case["runs"]
        default = next(r for r in runs if r["run"] == "torch.compile")
        for r in runs:
            time = (
                f"{r['step_seconds'] * 1e3:.1f} ms | "
                f"{r['step_seconds'] / default['step_seconds']:.2f}"
            )
            if "budget" not in r:
                lines.append(
                    f"| {case['case']} | {r['run']} | | | {format_bytes(r['peak'])} | | | | "
                    f"{time} | | |"
                )
                continue
            plans = "; ".join(
                f"{p['name']}: {p['recomputed']} recomputed, {format_bytes(p['held'])} held"
                for p in r["plans"]
            )
            lines.append(
                f"| {case['case']} | {r['run']} | {format_bytes(r['budget'])} | "
                f"{format_bytes(r['step1_predicted'])} | "
                f"{', '.join(format_bytes(p) for p in r['step_peaks'])} | "
                f"{format_bytes(r['predicted_peak'])} | "
                f"{'yes' if r['peak'] <= r['budget'] else 'no'} | "
                f"{'yes' if r['room_made'] else 'no'} | {time} | {plans} | "
                f"{r['max_grad_error']:.1e} |"
            )
    return "\n".join(lines) + "\n"


SECTION = ResultsSection("graph breaks", __doc__.splitlines()[0], measure, section_text)


if __name__ == "__main__":
    raise SystemExit(SECTION.main())
