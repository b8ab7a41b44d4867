"""`python -m benchmarks.layout_speed`: what a convolutional graph's step time owes to
Inductor's layout optimization when memplan's backend holds it to a budget.

The optimization (channels-last kernels) is for speed, and it can take a graph over its
budget: its channels-last copies are memory the unfused graphs do not hold. The backend
plans such a graph lower with the optimization on, and compiles it without it only where
no round with it holds the budget (memplan/compile/backend.py). This measures what that order
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

import sys
import warnings
from collections.abc import Callable
from typing import Any

from rich.progress import track

from benchmarks.compiled import Compiled, CompiledRun
from benchmarks.models import SIZES, Bench, machine
from benchmarks.pages import section_benchmark
from benchmarks.paths import DOCS, RESULTS
from memplan.core.errors import MemplanError
from memplan.core.units import format_bytes
from memplan.tools.zoo import ZOO

PAGE = DOCS / "measurement.md"
MARKERS = ("<!-- layout speed: start -->", "<!-- layout speed: end -->")
MODEL = "resnet50"
SHARES = ("90%", "70%")
REPEATS = 7
SOLVER = "greedy"
TIME_LIMIT = 20.0  # seconds per solve, as benchmarks.compiled's default
DEFAULT_BUDGET = 1.0  # torch.compile's default activation_memory_budget
LAYOUT_OFF = {"layout_optimization": False}


def row(label: str, run: CompiledRun, eager_seconds: float) -> dict[str, Any]:
    """What the page shows of `run`; a run that failed fails the benchmark."""
    if not run.measured:
        raise MemplanError(f"{label}: {run.status}")
    assert run.step_seconds is not None
    measured: dict[str, Any] = {
        "run": label,
        "measured_peak": run.measured_peak,
        "compile_seconds": run.plan_seconds,  # the first step's wall time
        "raw_step_seconds": run.raw_step_seconds,
        "step_seconds": run.step_seconds,
        "step_ratio": run.step_seconds / eager_seconds,
    }
    if run.method == "memplan":
        measured |= {
            "budget": run.budget,
            "predicted_peak": run.predicted_peak,
            "recomputed": run.decisions["recompute"],
            "layout_optimization": all(run.layout_optimization),
        }
    return measured


def measure() -> dict[str, Any]:
    """Every run of the module docstring, in order, as benchmarks.compiled measures its
    runs (each on a fresh copy of the model, timed against eager's step)."""
    warnings.filterwarnings("ignore", category=UserWarning)
    runner = Compiled(Bench(ZOO[MODEL](**SIZES[MODEL]), REPEATS, TIME_LIMIT), SOLVER, TIME_LIMIT)
    eager_seconds = runner.eager().step_seconds
    assert eager_seconds is not None
    settings: list[tuple[str, Callable[[], CompiledRun]]] = [
        ("torch.compile", lambda: runner.pytorch(DEFAULT_BUDGET))
    ]
    for share in SHARES:
        off = f"memplan {share}, layout optimization off"
        settings += [
            (f"memplan {share}", lambda s=share: runner.memplan(s, s)),
            (off, lambda s=share: runner.memplan(s, s, inductor_config=LAYOUT_OFF)),
        ]
    rows = [
        row(label, measure_run(), eager_seconds)
        for label, measure_run in track(settings, description="compiling and timing")
    ]
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
    path = RESULTS / "layout-speed-cpu.json"
    description = __doc__.splitlines()[0]
    return section_benchmark(argv, description, path, PAGE, MARKERS, measure, markdown)


if __name__ == "__main__":
    sys.exit(main())
