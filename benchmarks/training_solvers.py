"""`python -m benchmarks.training_solvers`: the training-problem solvers on the zoo models.

Each zoo model is traced and profiled once on this CPU; every solver then plans that same
graph (same profiled times, so the comparison is fair) at budgets of 0.9, 0.7, 0.5 and 0.3
of the unplanned peak, plus one least-memory run. Schedules are judged by the simulator:
a result meets its budget only if its simulated peak does. Writes
benchmarks/results/training-solvers.json and docs/training-solvers.md.
Run: `python -m benchmarks.training_solvers [--models mlp,gpt2] [--time-limit 20]
[--report-only]`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress

from benchmarks.paths import DOCS, RESULTS, ROOT
from memplan.core.budget import Budget
from memplan.core.errors import MemplanError
from memplan.core.files import write_json_atomically
from memplan.core.graph import Graph
from memplan.core.simulate import MemoryTrace, simulate
from memplan.planner.capture import compile_training_step
from memplan.planner.options import PlanOptions
from memplan.planner.partitioner import Partitioner
from memplan.solvers import SolverOptions, get_solver
from memplan.tools.zoo import ZOO

JSON = RESULTS / "training-solvers.json"
PAGE = DOCS / "training-solvers.md"
MODELS = ("mlp", "cnn", "gpt2", "bert", "vit", "resnet")
SOLVERS = ("greedy", "chain_dp", "linear", "director", "milp", "cpsat")
SHARES = (0.9, 0.7, 0.5, 0.3)


@dataclass(frozen=True)
class Row:
    """One solver on one model at one budget (share None: the least-memory run)."""

    model: str
    solver: str
    share: float | None
    budget: int
    status: str  # the solver's, or "error: ..." when it raised
    peak: int | None  # simulated
    peak_ratio: float | None  # peak / the unplanned peak
    time_ratio: float | None  # simulated step time / the unplanned one
    within_budget: bool  # simulated peak <= budget (never status alone)
    wall_seconds: float
    message: str


def machine() -> str:
    """Where the solves ran, in a few words."""
    cpu = platform.processor() or platform.machine()
    return (
        f"{cpu}, {os.cpu_count()} CPU cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), {time.strftime('%Y-%m-%d')}"
    )


def trace(name: str) -> Graph:
    """The model's joint training graph with profiled node times."""
    example = ZOO[name]()
    part = Partitioner(Budget.parse("100%"), PlanOptions(progress=False), name=name)
    compile_training_step(copy.deepcopy(example.model), example.inputs, part)
    return part.lowered[0].graph


def solve(
    name: str, graph: Graph, ref: MemoryTrace, solver: str, share: float | None, limit: float
) -> Row:
    """Run one solver and judge its schedule with the simulator."""
    budget = 0 if share is None else int(share * ref.peak)
    options = SolverOptions(time_limit=limit)
    started = time.perf_counter()
    try:
        result = get_solver(solver)(graph, None if share is None else budget, options)
        wall = time.perf_counter() - started
        trace_ = None if result.schedule is None else simulate(graph, result.schedule)
        status, message = result.status, result.message
    except MemplanError as error:
        wall, trace_, status, message = time.perf_counter() - started, None, "error", str(error)
    peak = None if trace_ is None else trace_.peak
    return Row(
        model=name,
        solver=solver,
        share=share,
        budget=budget,
        status=status,
        peak=peak,
        peak_ratio=None if peak is None else peak / ref.peak,
        time_ratio=None if trace_ is None else trace_.time / ref.time,
        within_budget=peak is not None and (share is None or peak <= budget),
        wall_seconds=wall,
        message=message,
    )


def _table(header: str, models: list[str], solvers: list[str], cells: Any) -> list[str]:
    """A models x solvers table; cells(model) -> list of strings, one per solver."""
    lines = [header, "", f"| model | {' | '.join(solvers)} |", "|---" * (len(solvers) + 1) + "|"]
    lines += [f"| {m} | {' | '.join(cells(m))} |" for m in models]
    return [*lines, ""]


def _fraction(row: Row | None) -> str:
    return "—" if row is None or row.peak_ratio is None else f"{row.peak_ratio:.3f}"


def markdown(data: dict[str, Any]) -> str:
    """docs/training-solvers.md from the saved figures."""
    rows = [Row(**r) for r in data["rows"]]
    least = {(r["model"], r["solver"]): Row(**r) for r in data["least"]}
    models = list(dict.fromkeys(r.model for r in rows))
    solvers = list(dict.fromkeys(r.solver for r in rows))
    shares = list(dict.fromkeys(r.share for r in rows))
    lines = [
        "# Training-problem solvers on the model zoo",
        "",
        "Written by `python -m benchmarks.training_solvers`; raw figures in "
        "`benchmarks/results/training-solvers.json`. Do not edit by hand.",
        "",
        "Each zoo model is traced and profiled once; every solver then plans the same joint "
        "graph, at budgets that are a share of the unplanned (eager) peak. Peaks and step "
        "times are the simulator's predictions from the node times profiled on this CPU, "
        "not measurements of planned steps. A schedule meets its budget only if its "
        "simulated peak does, whatever status the solver reported.",
        "",
        f"Machine: {data['machine']}; time limit {data['time_limit']:g} s per solve.",
        "",
    ]
    for share in shares:
        at = {(r.model, r.solver): r for r in rows if r.share == share}

        def ratios(model: str, at: dict[tuple[str, str], Row] = at) -> list[str]:
            found = [at.get((model, s)) for s in solvers]
            ok = [r.time_ratio for r in found if r and r.within_budget and r.time_ratio]
            best = min(ok, default=None)
            cells = []
            for r in found:
                if r is None or not r.within_budget or r.time_ratio is None:
                    cells.append("—")
                else:
                    text = f"{r.time_ratio:.3f}"
                    cells.append(f"**{text}**" if f"{best:.3f}" == text else text)
            return cells

        header = (
            f"## Budget {share:g} x eager peak: step time / eager "
            "(— = nothing within the budget; bold = fastest)"
        )
        lines += _table(header, models, solvers, ratios)
    lines += _table(
        "## Least peak (budget None), as a fraction of the eager peak",
        models,
        solvers,
        lambda m: [_fraction(least.get((m, s))) for s in solvers],
    )
    lines += _table(
        "## Solve wall time, max over the budgets (s)",
        models,
        solvers,
        lambda m: [
            f"{max(r.wall_seconds for r in rows if r.model == m and r.solver == s):.2f}"
            for s in solvers
        ],
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated zoo names")
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds per solve")
    parser.add_argument("--report-only", action="store_true", help="rewrite the page from JSON")
    args = parser.parse_args(argv)
    console = Console()
    if args.report_only:
        PAGE.write_text(markdown(json.loads(JSON.read_text())))
        console.print(f"wrote {PAGE.relative_to(ROOT)}")
        return
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(ZOO))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {sorted(ZOO)}")
    rows: list[Row] = []
    least: list[Row] = []
    with Progress(console=console) as progress:
        task = progress.add_task("solving", total=len(models) * len(SOLVERS) * (len(SHARES) + 1))
        for name in models:
            progress.update(task, description=f"tracing {name}")
            graph = trace(name)
            ref = simulate(graph, get_solver("keep_all")(graph, 0, SolverOptions()).schedule)
            for solver in SOLVERS:
                for share in (*SHARES, None):
                    progress.update(task, description=f"{solver} on {name} at {share or 'least'}")
                    row = solve(name, graph, ref, solver, share, args.time_limit)
                    (rows if share is not None else least).append(row)
                    progress.advance(task)
    data = {
        "machine": machine(),
        "time_limit": args.time_limit,
        "rows": [asdict(r) for r in rows],
        "least": [asdict(r) for r in least],
    }
    write_json_atomically(JSON, data)
    PAGE.write_text(markdown(data))
    console.print(f"wrote {JSON.relative_to(ROOT)} and {PAGE.relative_to(ROOT)}")
    for r in rows:
        if r.status in ("optimal", "feasible") and not r.within_budget:
            console.print(f"[red]{r.solver} on {r.model} at {r.share}: {r.status} but peak "
                          f"{r.peak} > budget {r.budget}[/red]")  # fmt: skip


if __name__ == "__main__":
    main()
