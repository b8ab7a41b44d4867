"""`python -m benchmarks.sweep`: the peak as the budget falls, memplan against PyTorch.

On two zoo models at the head-to-head's sizes (benchmarks/models.py), memplan plans at
every 5% of its unplanned peak from 100% down to where no plan fits, and at its least
feasible budget; PyTorch's min-cut partitioner runs at every activation memory budget
from 1.0 down to 0.0 by 0.05. Each step is read by the allocator. memplan's peak must
never rise as its budget falls; PyTorch's is shown as it comes. Writes
benchmarks/results/sweep-<device>.json and docs/img/sweep_<model>.png; docs/results.md
(benchmarks.models) shows them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import warnings
from dataclasses import asdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from rich.console import Console
from rich.progress import Progress

from benchmarks.models import LEAST, SIZES, Bench, Run, machine
from benchmarks.paths import DOCS, RESULTS
from memplan.tools.zoo import ZOO

IMAGES = DOCS / "img"
MODELS = ("gpt2", "cnn")
SHARES = tuple(range(100, 0, -5))  # memplan's budgets, % of its unplanned peak
PYTORCH_BUDGETS = tuple(round(1 - 0.05 * i, 2) for i in range(21))


def sweep(name: str, repeats: int, time_limit: float, advance: Any) -> list[Run]:
    """memplan down to its least feasible budget, then PyTorch at every budget."""
    bench = Bench(ZOO[name](**SIZES.get(name, {})), repeats, time_limit)
    runs = [bench.eager()]
    for share in SHARES:
        run = bench.memplan("greedy", f"{share}%", f"{share}%")
        advance(run.label)
        if run.status == "infeasible":
            break
        runs.append(run)
    runs.append(bench.memplan("greedy", LEAST, LEAST))
    for budget in PYTORCH_BUDGETS:
        runs.append(bench.pytorch(budget))
        advance(runs[-1].label)
    return runs


def rises(peaks: list[int]) -> int:
    """How many times a peak rises above the one before it."""
    return sum(1 for before, after in itertools.pairwise(peaks) if after > before)


def summary(runs: list[Run]) -> dict[str, Any]:
    """Per method, the peaks in budget order and how often they rose as the budget fell."""
    memplan = [r.measured_peak for r in runs if r.method == "memplan" and r.measured]
    pytorch = [r.measured_peak for r in runs if r.method == "pytorch" and r.measured]
    eager = next(r.measured_peak for r in runs if r.method == "eager")
    return {
        "memplan_rises": rises(memplan),  # type: ignore[arg-type]
        "pytorch_rises": rises(pytorch),  # type: ignore[arg-type]
        "memplan_least": min(memplan),  # type: ignore[type-var]
        "pytorch_least": min(pytorch),  # type: ignore[type-var]
        "pytorch_at_0": pytorch[-1],
        "eager": eager,
    }


def plot(model: str, runs: list[Run], path: Path) -> None:
    """Measured peak against the budget, falling to the right, for both methods."""
    figure, axes = plt.subplots(figsize=(7, 4))
    eager = next(r for r in runs if r.method == "eager")
    ours = [r for r in runs if r.method == "memplan" and r.measured]
    theirs = [r for r in runs if r.method == "pytorch" and r.measured]
    # memplan's budgets as shares of its unplanned peak: its first run's (at 100%)
    xs = [r.budget / ours[0].budget for r in ours]  # type: ignore[operator]
    axes.plot(xs, [r.measured_peak / 2**20 for r in ours], "o-", color="tab:red",  # type: ignore[operator]
              label="memplan: budget as a share of its unplanned peak")  # fmt: skip
    axes.plot([float(r.setting) for r in theirs], [r.measured_peak / 2**20 for r in theirs],  # type: ignore[operator]
              "s-", color="tab:blue", label="PyTorch: activation_memory_budget")  # fmt: skip
    axes.axhline(eager.measured_peak / 2**20, color="0.5", linestyle="--", linewidth=1,  # type: ignore[operator]
                 label="eager")  # fmt: skip
    axes.invert_xaxis()
    axes.set_xlabel("budget (falling to the right)")
    axes.set_ylabel("peak by the allocator (MiB)")
    axes.set_title(f"{model}: the peak as the budget falls")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(SIZES), default=list(MODELS))
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per run (median)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds per solve")
    parser.add_argument("--report-only", action="store_true", help="redraw from the JSON")
    args = parser.parse_args(argv)
    where = machine()
    out = RESULTS / f"sweep-{where['device']}.json"
    if args.report_only:
        saved = json.loads(out.read_text())
        for model, found in saved["models"].items():
            plot(model, [Run(**r) for r in found["runs"]], IMAGES / f"sweep_{model}.png")
        return
    found: dict[str, Any] = {}
    warnings.filterwarnings("ignore", category=UserWarning)
    with Progress(console=Console()) as progress:
        task = progress.add_task("sweeping", total=len(args.models) * (len(SHARES) + 22))
        for name in args.models:

            def advance(label: str, name: str = name) -> None:
                progress.update(task, advance=1, description=f"{name}: {label}")

            runs = sweep(name, args.repeats, args.time_limit, advance)
            found[name] = {"summary": summary(runs), "runs": [asdict(r) for r in runs]}
            plot(name, runs, IMAGES / f"sweep_{name}.png")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": where, "models": found}, indent=1))
    Console().print(f"wrote {out} and docs/img/sweep_*.png; `make bench` shows them in results.md")


if __name__ == "__main__":
    main()
