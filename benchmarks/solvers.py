"""`python -m benchmarks.solvers`: every solver on every benchmark graph of the literature.

For each graph in benchmarks/graphs and each budget (a share of the reference order's
peak, 0.9, 0.8 and 0.7 by default), each general-problem solver runs under a time limit;
its schedule is judged by the simulator and scored by the literature's rules. Writes
benchmarks/results/solvers.json and the results section of docs/solvers.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from memplan import remat, solvers
from memplan.errors import MemplanError
from memplan.graph import load_node_link

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = ROOT / "benchmarks" / "graphs"
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
SHARES = ("0.9", "0.8", "0.7")


@dataclass(frozen=True)
class Row:
    """One solver on one graph at one budget."""

    graph: str
    nodes: int
    share: str
    budget: int
    solver: str
    status: str  # the solver's, or "error: ..." when it raised
    peak: int | None
    duration_increase: float | None  # (D - D0) / D0
    gap: float | None
    wall_seconds: float


def run_one(path: Path, share: str, solver: str, time_limit: float) -> Row:
    graph = load_node_link(path)
    budget = remat.resolve_budget(graph, share)
    reference = remat.reference(graph)
    options = solvers.SolverOptions(time_limit=time_limit, problem="general")
    started = time.perf_counter()
    try:
        result = solvers.get_solver(solver)(graph, budget, options)
        if result.schedule is None:  # e.g. a time limit with no feasible point found
            wall = time.perf_counter() - started
            return Row(graph.name, len(graph), share, budget, solver, result.status, None,
                       None, result.gap, wall)  # fmt: skip
        report = remat.solved_schedule(graph, budget, result)
    except MemplanError as error:
        wall = time.perf_counter() - started
        return Row(graph.name, len(graph), share, budget, solver, f"error: {error}", None, None,
                   None, wall)  # fmt: skip
    wall = time.perf_counter() - started
    increase = (report["duration"] - reference.duration) / reference.duration
    return Row(graph.name, len(graph), share, budget, solver, result.status, report["peak"],
               increase, result.gap, wall)  # fmt: skip


def table(rows: list[Row], where: dict[str, object], time_limit: float) -> str:
    lines = [
        "## Results on the literature's graphs",
        "",
        "Written by `python -m benchmarks.solvers`; raw figures in "
        "`benchmarks/results/solvers.json`. Do not edit this section by hand.",
        "",
        f"Machine: {where['machine']}, {where['cpus']} CPU cores, Python {where['python']}, "
        f"{where['date']}; time limit {time_limit:g} s per solve.",
        "",
        "Budget = ceil(share x P0), P0 the reference order's peak. TDI = total duration "
        "increase over the reference order, (D - D0) / D0. Every schedule was accepted by "
        "the simulator; `infeasible` rows carry the least peak the solver reached.",
        "",
        "| graph | nodes | share | solver | status | peak / budget | TDI | gap | wall |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        peak = "-" if r.peak is None else f"{r.peak / r.budget:.3f}"
        tdi = "-" if r.duration_increase is None else f"{r.duration_increase:+.2%}"
        gap = "-" if r.gap is None else f"{r.gap:.2%}"
        lines.append(
            f"| {r.graph} | {r.nodes} | {r.share} | {r.solver} | {r.status} | {peak} | {tdi} "
            f"| {gap} | {r.wall_seconds:.2f} s |"
        )
    return "\n".join(lines) + "\n"


START, END = "<!-- results: written by benchmarks/solvers.py -->", "<!-- results end -->"


def write_section(page: Path, text: str) -> None:
    """Put `text` between the page's result markers (appending them the first time)."""
    content = page.read_text() if page.exists() else ""
    if START in content and END in content:
        before, rest = content.split(START, 1)
        after = rest.split(END, 1)[1]
    else:
        before, after = content.rstrip("\n") + "\n\n", "\n"
    page.write_text(f"{before}{START}\n{text}{END}{after}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--solvers", nargs="+", default=None, help="default: all general ones")
    parser.add_argument("--graphs", nargs="+", default=None, help="file stems; default: all")
    parser.add_argument("--shares", nargs="+", default=list(SHARES))
    parser.add_argument("--time-limit", type=float, default=60.0)
    args = parser.parse_args(argv)
    names = args.solvers or solvers.available("general")
    paths = sorted(GRAPHS.glob("*.json"))
    if args.graphs:
        paths = [p for p in paths if p.stem in set(args.graphs)]
    work = [(p, s, n) for p in paths for s in args.shares for n in names]
    rows: list[Row] = []
    console = Console()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("solving", total=len(work))
        for path, share, name in work:
            progress.update(task, description=f"{name} on {path.stem} at {share}")
            rows.append(run_one(path, share, name, args.time_limit))
            progress.advance(task)
    where = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    payload = {"machine": where, "time_limit": args.time_limit, "rows": [asdict(r) for r in rows]}
    (RESULTS / "solvers.json").write_text(json.dumps(payload, indent=1))
    write_section(DOCS / "solvers.md", table(rows, where, args.time_limit))
    console.print(f"wrote benchmarks/results/solvers.json and docs/solvers.md ({len(rows)} runs)")


if __name__ == "__main__":
    main()
