"""`python -m benchmarks.layout_copies`: a convolution's layout copies inside its kernel, or
made in the graph (passes/contiguous.py)?

On the zoo's ConvNeXt, greedy plans the step with the copies inside the kernels only
(`convolution_copies="kernel"`), in the graph only ("graph") and with memplan choosing
("choose": each graph planned both ways, the faster plan within the budget kept), at the
unplanned peak, 70% and 50% of it (each in the bytes of the kernel-only way's share) and at
each way's least feasible budget; each planned step is read by the allocator (its peak) and
timed (the median of REPEATS steps), and the gradients are compared with eager's. Writes
benchmarks/results/layout-copies-<device>.json and the section of docs/measurement.md
between its markers. Run it alone: step times on a shared machine are noise.
"""

from __future__ import annotations

import copy
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from rich.progress import track

import memplan
from benchmarks.pages import section_benchmark
from benchmarks.paths import DOCS, RESULTS
from memplan.core.budget import Budget
from memplan.core.units import format_bytes
from memplan.planner.measure import median_step_seconds
from memplan.tools.verify import compare_grads, steady_step_peak, training_step
from memplan.tools.zoo import ZOO, Example

PAGE = DOCS / "measurement.md"
MARKERS = ("<!-- layout copies: start -->", "<!-- layout copies: end -->")
WAYS = {"inside the kernel": "kernel", "in the graph": "graph", "memplan's choice": "choose"}
MADE = {"kernel": "inside the kernel", "graph": "in the graph"}  # a plan's recorded way
SETTINGS = ("100%", "70%", "50%", "least")
# Steps of about 15 ms on a 2-core CPU are noisy by a few ms: time many.
REPEATS = 21


@dataclass(frozen=True)
class Row:
    way: str
    setting: str
    chosen: str  # where the plan's copies are made: "inside the kernel" or "in the graph"
    budget: int
    unplanned_peak: int
    predicted_peak: int
    measured_peak: int  # the allocator's
    step_seconds: float
    max_grad_error: float
    grads_match: bool


def run(example: Example, way: str, setting: str, budget: str | Budget) -> Row:
    options = {"convolution_copies": WAYS[way], "progress": False}
    model = copy.deepcopy(example.model)
    if setting == "least":
        try:
            memplan.plan(copy.deepcopy(model), example.inputs, "1 B", **options)
        except memplan.InfeasibleBudget as error:
            budget = Budget(bytes=error.smallest_feasible)
    try:
        planned = memplan.optimize(model, example.inputs, budget, **options)
    except memplan.InfeasibleBudget as error:
        return Row(
            way, setting, "no plan", error.budget, 0, error.smallest_feasible, 0, 0.0, 0.0, False
        )
    peak = steady_step_peak(planned, model, example.inputs)
    eager = copy.deepcopy(example.model)
    training_step(eager, example.inputs)()
    error, match = compare_grads(model, {n: p.grad for n, p in eager.named_parameters()})
    step = training_step(planned, example.inputs)
    seconds = median_step_seconds(step, device=torch.device("cpu"), repeats=REPEATS, warmup=3)
    plan = planned.plan
    chosen = MADE[str(plan.options["convolution_copies"])]
    return Row(way, setting, chosen, plan.budget, plan.unplanned_peak, plan.predicted_peak,
               peak, seconds, error, match)  # fmt: skip


def markdown(data: dict[str, Any]) -> str:
    rows = [Row(**r) for r in data["rows"]]
    lines = [
        f"Written by `python -m benchmarks.layout_copies` on {data['machine']}: the zoo's "
        f"ConvNeXt ({data['size']}), planned by greedy, peaks read by the allocator, step "
        f"times the median of {REPEATS}.",
        "",
        "| copies | budget | plan's copies | unplanned peak | predicted peak | measured peak "
        "| step time | gradients |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        budget = f"{r.setting} ({format_bytes(r.budget)})"
        if r.chosen == "no plan":
            lines.append(
                f"| {r.way} | {budget} | none: the least feasible peak is "
                f"{format_bytes(r.predicted_peak)} | | | | | |"
            )
            continue
        grads = "eager's" if r.grads_match else f"differ by {r.max_grad_error:.2g}"
        lines.append(
            f"| {r.way} | {budget} | {r.chosen} | {format_bytes(r.unplanned_peak)} | "
            f"{format_bytes(r.predicted_peak)} | {format_bytes(r.measured_peak)} | "
            f"{r.step_seconds * 1e3:.1f} ms | {grads} |"
        )
    return "\n".join([*lines, ""]) + "\n"


def measure() -> dict[str, Any]:
    """Every way at every setting, on ConvNeXt."""
    size = {"batch": 8, "image": 64, "width": 16}
    example = ZOO["convnext"](**size)
    found = []
    for setting in track(SETTINGS, description="planning and timing each way"):
        # the kernel-only way first: the others are held to its bytes at each share
        kernel = run(example, "inside the kernel", setting, setting)
        same = Budget(bytes=kernel.budget)
        others = [run(example, way, setting, same) for way in list(WAYS)[1:]]
        found += [asdict(row) for row in (kernel, *others)]
    found.sort(key=lambda row: list(WAYS).index(row["way"]))
    cpu = platform.processor() or platform.machine()
    machine = f"{cpu}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}"
    return {"machine": machine, "size": json.dumps(size), "rows": found}


def main(argv: list[str] | None = None) -> int:
    path = RESULTS / "layout-copies-cpu.json"
    description = __doc__.splitlines()[0]
    return section_benchmark(argv, description, path, PAGE, MARKERS, measure, markdown)


if __name__ == "__main__":
    sys.exit(main())
