"""`python -m benchmarks.layout_speed`: what a convolutional graph's step time owes to
Inductor's layout optimization when memplan's backend holds it to a budget.

The optimization (channels-last kernels) is for speed, and it can take a graph over its
budget: its channels-last copies are memory the unfused graphs do not hold. The backend
plans such a graph lower with the optimization on, and compiles it without it only where
no round with it holds the budget (memplan/backends.py). This measures what that order
is worth. ResNet-50 of the zoo, at the head-to-head's sizes (benchmarks.models.SIZES),
trains under torch.compile's default and under memplan's backend at each of SHARES, once
as the backend chooses and once with `inductor_config={"layout_optimization": False}`
(what the backend did until 2026-11-27 wherever the first plan, compiled with the
optimization, peaked over the budget). Per run: the allocator's peak of a steady step,
the plan's budget, prediction, recomputed count and layout, the compile time (the first
step), and the step time as eager's median times the median, over REPEATS pairs, of the
run's step over an eager step timed just before it
(memplan.planner.measure.paired_step_seconds). On the CPU. Writes
benchmarks/results/layout-speed-cpu.json and the section of docs/measurement.md between
MARKERS. Run it alone: step times on a shared machine are noise.
"""

from __future__ import annotations

import copy
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from rich.progress import track

import memplan
from benchmarks.models import SIZES, machine
from benchmarks.pages import section_benchmark
from memplan.planner.measure import median_step_seconds, paired_step_seconds
from memplan.tools.verify import steady_step_peak, training_step
from memplan.tools.zoo import ZOO
from memplan.units import format_bytes

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "measurement.md"
MARKERS = ("<!-- layout speed: start -->", "<!-- layout speed: end -->")
MODEL = "resnet50"
SHARES = ("90%", "70%")
REPEATS = 7
LAYOUT_OFF = {"layout_optimization": False}


def run(
    label: str, model: torch.nn.Module, inputs: tuple[Any, ...], eager: Any, backend: Any
) -> dict[str, Any]:
    """One compile of a copy of `model` (torch.compile's default where `backend` is None),
    measured and timed against `eager` at once: a later Dynamo reset would compile it again."""
    torch._dynamo.reset()
    copied = copy.deepcopy(model)
    compiled = torch.compile(copied) if backend is None else torch.compile(copied, backend=backend)
    started = time.perf_counter()
    training_step(compiled, inputs)()
    compile_seconds = time.perf_counter() - started
    peak = steady_step_peak(compiled, copied, inputs)
    raw, ratio = paired_step_seconds(
        training_step(compiled, inputs), eager, device=torch.device("cpu"), repeats=REPEATS
    )
    row: dict[str, Any] = {
        "run": label,
        "measured_peak": peak,
        "compile_seconds": compile_seconds,
        "raw_step_seconds": raw,
        "step_ratio": ratio,
    }
    if backend is not None:
        (plan,) = backend.plans
        row |= {
            "budget": plan.budget,
            "predicted_peak": plan.peak,
            "recomputed": plan.counts()["recompute"],
            "layout_optimization": plan.options.get("layout_optimization", True),
        }
    return row


def measure() -> dict[str, Any]:
    """Every run of the module docstring, in order."""
    warnings.filterwarnings("ignore", category=UserWarning)
    example = ZOO[MODEL](**SIZES[MODEL])
    model, inputs = example.model, tuple(example.inputs)
    eager = training_step(model, inputs)
    eager_seconds = median_step_seconds(eager, device=torch.device("cpu"), repeats=REPEATS)
    settings: list[tuple[str, Any]] = [("torch.compile", lambda: None)]
    for share in SHARES:
        settings.append(
            (f"memplan {share}", lambda s=share: memplan.backend(budget=s, progress=False))
        )
        settings.append(
            (
                f"memplan {share}, layout optimization off",
                lambda s=share: memplan.backend(
                    budget=s, progress=False, inductor_config=LAYOUT_OFF
                ),
            )
        )
    rows = [
        run(label, model, inputs, eager, make())
        for label, make in track(settings, description="compiling and timing")
    ]
    for row in rows:
        row["step_seconds"] = row["step_ratio"] * eager_seconds
    return {
        "machine": machine("cpu"),
        "sizes": SIZES[MODEL],
        "eager_seconds": eager_seconds,
        "rows": rows,
    }


def markdown(data: dict[str, Any]) -> str:
    """The section of docs/measurement.md (without its markers)."""
    where = data["machine"]
    lines = [
        "## Layout optimization's speed under a budget",
        "",
        f"Written by `python -m benchmarks.layout_speed` ({where['date']}, {where['device_name']}, "
        f"{where['cpu_threads']} threads, torch {where['torch']}); the raw figures are in "
        f"`benchmarks/results/layout-speed-{where['device']}.json`. ResNet-50, sizes "
        + ", ".join(f"{k} {v}" for k, v in data["sizes"].items())
        + f"; eager's step: {data['eager_seconds'] * 1e3:.1f} ms. Step time: eager's median "
        f"times the median of {REPEATS} paired ratios.",
        "",
        "| run | budget | layout optimization | recomputed | predicted | measured peak "
        "| step time | vs eager | compile time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in data["rows"]:
        planned = "budget" in row
        lines.append(
            f"| {row['run']} | {format_bytes(row['budget']) if planned else '-'} | "
            f"{('on' if row['layout_optimization'] else 'off') if planned else 'on'} | "
            f"{row['recomputed'] if planned else '-'} | "
            f"{format_bytes(row['predicted_peak']) if planned else '-'} | "
            f"{format_bytes(row['measured_peak'])} | {row['step_seconds'] * 1e3:.1f} ms | "
            f"{row['step_ratio'] - 1:+.1%} | {row['compile_seconds']:.0f} s |"
        )
    return "\n".join(lines) + "\n\n"


def main(argv: list[str] | None = None) -> int:
    path = ROOT / "benchmarks" / "results" / "layout-speed-cpu.json"
    description = __doc__.splitlines()[0]
    return section_benchmark(argv, description, path, PAGE, MARKERS, measure, markdown)


if __name__ == "__main__":
    sys.exit(main())
