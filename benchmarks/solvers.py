"""`python -m benchmarks.solvers`: every solver on every benchmark graph of the literature.

For each graph in benchmarks/graphs and each budget (a share of the reference order's
peak, 0.9, 0.8 and 0.7 by default), each general-problem solver runs under a time limit;
its schedule is judged by the simulator and scored by the literature's rules. The exact
solvers run again with paging (`milp+paging`, `cpsat+paging`) over a host link that
moves the graph's outputs, all of them once, in the reference order's duration (the
graphs carry no bandwidth of their own). Solves run in parallel worker processes, one
thread each. Writes benchmarks/results/solvers.json (after every solve, so an
interrupted run keeps what it did) and the results section of docs/solvers.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from benchmarks.layered import random_layered_graph
from benchmarks.pages import write_section
from benchmarks.paths import DOCS, RESULTS, ROOT
from memplan import solvers
from memplan.core import remat
from memplan.core.errors import MemplanError
from memplan.core.graph import Graph
from memplan.core.node_link import load_node_link
from memplan.core.schedule_file import solved_schedule
from memplan.solvers.bounds import peak_lower_bound

GRAPHS = ROOT / "benchmarks" / "graphs"
SHARES = ("0.9", "0.8", "0.7")
PAGING = "+paging"  # a solver name with this suffix runs with the host link
EXACT = ("milp", "cpsat")
# The limits: 60 s up to 500 nodes, 300 s at 1000.
LARGE_NODES, LARGE_TIME_LIMIT = 1000, 300.0
# The director's scale target: a generated layered graph of this many nodes, within 5 s.
SCALE_NODES, SCALE_SECONDS = 10_000, 5.0


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
    time_limit: float = 0.0
    bandwidth: float | None = None  # bytes per time unit, for the paging rows
    file: str = ""  # the graph's file stem in benchmarks/graphs
    workers: int = 0  # solves running at a time in the run that made this row (0: unknown)


def link(graph: Graph, reference: remat.Score) -> float:
    """The benchmark's host link: all outputs moved once in the reference duration."""
    return sum(n.bytes for n in graph) / reference.duration


def run_one(path: Path, share: str, solver: str, time_limit: float) -> Row:
    graph = load_node_link(path)
    budget = remat.resolve_budget(graph, share)
    reference = remat.reference(graph)
    name = solver.removesuffix(PAGING)
    bandwidth = link(graph, reference) if solver.endswith(PAGING) else None
    options = solvers.SolverOptions(time_limit=time_limit, problem="general", bandwidth=bandwidth)
    row = Row(graph.name, len(graph), share, budget, solver, "", None, None, None, 0.0,
              time_limit, bandwidth, path.stem)  # fmt: skip
    started = time.perf_counter()
    try:
        result = solvers.get_solver(name)(graph, budget, options)
        if result.schedule is None:  # e.g. a time limit with no feasible point found
            wall = time.perf_counter() - started
            return replace(row, status=result.status, gap=result.gap, wall_seconds=wall)
        report = solved_schedule(graph, budget, result, bandwidth=bandwidth)
    except MemplanError as error:
        wall = time.perf_counter() - started
        return replace(row, status=f"error: {error}", wall_seconds=wall)
    wall = time.perf_counter() - started
    increase = (report["duration"] - reference.duration) / reference.duration
    return replace(row, status=result.status, peak=report["peak"], duration_increase=increase,
                   gap=result.gap, wall_seconds=wall)  # fmt: skip


def table(rows: list[Row], where: dict[str, object], scale: list[dict[str, object]]) -> str:
    limits = sorted({r.time_limit for r in rows})
    lines = [
        "## Results on the literature's graphs",
        "",
        "Written by `python -m benchmarks.solvers`; raw figures in "
        "`benchmarks/results/solvers.json`. Do not edit this section by hand.",
        "",
        f"Machine: {where['machine']}, {where['cpus']} CPU cores, Python {where['python']}, "
        f"{where['date']}; time limit per solve: {', '.join(f'{t:g} s' for t in limits)} "
        f"(the larger at {LARGE_NODES} nodes); solves at a time: {_workers(rows)}.",
        "",
        "Budget = ceil(share x P0), P0 the reference order's peak. TDI = total duration "
        "increase over the reference order, (D - D0) / D0, where a paging row's D includes "
        "the time the compute stream waits on transfers. Every schedule was accepted by "
        "the simulator; `infeasible` and `timeout` rows carry the least peak found.",
        "",
        *targets(rows),
        *scale_lines(scale),
        "",
        *case_lines(rows),
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


def _workers(rows: list[Row]) -> str:
    """How many solves ran at a time, per solver (rows merged from several runs differ)."""
    by_count: dict[int, list[str]] = {}
    for solver in dict.fromkeys(r.solver for r in rows):
        counts = {r.workers for r in rows if r.solver == solver}
        for count in counts:
            by_count.setdefault(count, []).append(solver)
    return "; ".join(
        f"{'unknown' if count == 0 else count} for {', '.join(names)}"
        for count, names in sorted(by_count.items())
    )


def scale_lines(scale: list[dict[str, object]]) -> list[str]:
    """The director's scale target, from the timings of director_at_scale."""
    if not scale:
        return [f"- `director` on a generated {SCALE_NODES}-node graph: not run."]
    timings = ", ".join(f"{s['wall_seconds']:.2f} s at {s['share']} ({s['status']})" for s in scale)
    slowest = max(float(s["wall_seconds"]) for s in scale)  # type: ignore[arg-type]
    verdict = "met" if slowest <= SCALE_SECONDS else "missed"
    return [
        f"- `director` on a generated {SCALE_NODES}-node layered graph "
        f"(`benchmarks/layered.py`): {timings}; the {SCALE_SECONDS:g} s target is "
        f"{verdict}."
    ]


def case_lines(rows: list[Row]) -> list[str]:
    """Per graph and share: the best TDI without paging and its solver, against the
    general problem's bounds: the peak lower bound (memplan/solvers/bounds.py), which
    proves a budget below it infeasible, and TDI >= 0 (every node is computed once; the
    exact solvers' own bounds hold for their restricted models only), so the gap is the
    TDI itself. Cases no solver met and the bound does not settle are open."""
    lines = [
        "Per case, the best schedule without paging against the bounds of the general "
        "problem: the peak lower bound of [Lower bounds](#lower-bounds) (a budget below it "
        "is proved infeasible) and TDI >= 0 (every node is computed at least once; the "
        "exact solvers' own bounds hold only for their restricted models), so a case's gap "
        "is its best TDI.",
        "",
        "First within budget: the earliest wall time at which a solver without paging "
        "returned a schedule within the budget, and which; a solver's first such schedule "
        "may exist before it returns, so this is an upper bound on the time to the first.",
        "",
        "| graph | share | best TDI (gap) | by | first within budget | peak bound / budget "
        "| settled |",
        "|---|---|---|---|---|---|---|",
    ]
    bounds: dict[str, int] = {}
    for (stem, share), group in _cases(rows).items():
        if stem not in bounds:
            bounds[stem] = peak_lower_bound(load_node_link(GRAPHS / f"{stem}.json"))
        budget = group[0].budget
        met = [r for r in group if _fits(r) and not r.solver.endswith(PAGING)]
        best = min(met, key=lambda r: (r.duration_increase, r.solver), default=None)
        if best is not None:
            tdi, by, settled = f"{best.duration_increase:+.2%}", best.solver, "solved"
            first = min(met, key=lambda r: (r.wall_seconds, r.solver))
            soonest = f"{first.wall_seconds:.2f} s ({first.solver})"
        else:
            tdi = by = soonest = "-"
            settled = "proved infeasible" if bounds[stem] > budget else "open"
        lines.append(
            f"| {group[0].graph} | {share} | {tdi} | {by} | {soonest} "
            f"| {bounds[stem] / budget:.3f} | {settled} |"
        )
    return lines


def _cases(rows: list[Row]) -> dict[tuple[str, str], list[Row]]:
    """Rows by (graph file, share), in row order."""
    cases: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        cases.setdefault((r.file, r.share), []).append(r)
    return cases


def _fits(row: Row) -> bool:
    return row.status in ("optimal", "feasible") and row.duration_increase is not None


def targets(rows: list[Row]) -> list[str]:
    """The issue's targets, checked on these rows: exact solvers within 1% of the best
    duration any solver found (without paging), paging where remat alone falls short,
    and the fast solvers' wall times."""
    cases = _cases(rows)
    met = missed = reached = faster = 0
    misses: list[str] = []
    unrun: list[str] = []  # cases whose exact solves this run did not make
    for (graph, share), group in cases.items():
        remat_rows = [r for r in group if _fits(r) and not r.solver.endswith(PAGING)]
        exact = [r for r in remat_rows if r.solver in EXACT]
        paged = [r for r in group if _fits(r) and r.solver.endswith(PAGING)]
        best = min((r.duration_increase or 0.0 for r in remat_rows), default=None)
        if not any(r.solver in EXACT for r in group):
            unrun.append(f"{graph} at {share}")
        elif best is not None:
            top = min((r.duration_increase or 0.0 for r in exact), default=None)
            if top is not None and 1 + top <= 1.01 * (1 + best):
                met += 1
            else:
                missed += 1
                found = "nothing" if top is None else f"{top:+.2%}"
                misses.append(f"{graph} at {share} (best {best:+.2%}, exact {found})")
        if paged and best is None:
            reached += 1
        if paged and best is not None:
            faster += min(r.duration_increase or 0.0 for r in paged) < best
    wall = {
        name: max((r for r in rows if r.solver == name), key=lambda r: r.wall_seconds)
        for name in ("chain_dp", "linear", "director")
        if any(r.solver == name for r in rows)
    }
    lines = [
        "Against the issue's targets, from these rows:",
        "",
        f"- Exact solvers (`milp` or `cpsat`, without paging) within 1% of the best duration "
        f"any solver found without paging: {met} of {met + missed} cases that some solver "
        f"met.",
        f"- Paging: {reached} cases met only with paging; in {faster} cases that remat "
        f"alone also met, paging was faster than every remat schedule.",
        *(
            f"- `{name}`: at most {r.wall_seconds:.2f} s ({r.graph} at {r.share})."
            for name, r in wall.items()
        ),
    ]
    if misses:
        lines.append(f"- Exact solvers missed 1%: {'; '.join(misses)}.")
    if unrun:
        lines.append(f"- Exact solvers not run: {'; '.join(unrun)}.")
    return lines


START, END = "<!-- results: written by benchmarks/solvers.py -->", "<!-- results end -->"


def director_at_scale(shares: list[str]) -> list[dict[str, object]]:
    """The director's wall time on random_layered_graph(SCALE_NODES) at each share."""
    graph = random_layered_graph(SCALE_NODES)
    reference = remat.reference(graph)
    found = []
    for share in shares:
        budget = remat.resolve_budget(graph, share)
        options = solvers.SolverOptions(time_limit=60.0, problem="general")
        started = time.perf_counter()
        result = solvers.get_solver("director")(graph, budget, options)
        seconds = time.perf_counter() - started
        increase = None
        if result.status == "feasible" and result.objective is not None:
            increase = (result.objective - reference.duration) / reference.duration
        found.append(
            {"nodes": SCALE_NODES, "share": share, "status": result.status,
             "duration_increase": increase, "wall_seconds": seconds}
        )  # fmt: skip
    return found


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--solvers", nargs="+", default=None,
        help="default: every general solver, and milp and cpsat again with paging",
    )  # fmt: skip
    parser.add_argument("--graphs", nargs="+", default=None, help="file stems; default: all")
    parser.add_argument("--shares", nargs="+", default=list(SHARES))
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds per solve")
    parser.add_argument(
        "--large-time-limit", type=float, default=LARGE_TIME_LIMIT,
        help=f"seconds per solve on graphs of {LARGE_NODES} nodes or more",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--report-only", action="store_true",
        help="rewrite docs/solvers.md from benchmarks/results/solvers.json",
    )  # fmt: skip
    parser.add_argument(
        "--scale-only", action="store_true",
        help=f"only time the director on a generated {SCALE_NODES}-node graph",
    )  # fmt: skip
    args = parser.parse_args(argv)
    console = Console()
    if args.report_only or args.scale_only:
        payload = json.loads((RESULTS / "solvers.json").read_text())
        if args.scale_only:
            payload["scale"] = director_at_scale(args.shares)
            (RESULTS / "solvers.json").write_text(json.dumps(payload, indent=1))
        rows = [Row(**r) for r in payload["rows"]]
        text = table(rows, payload["machine"], payload.get("scale", []))
        write_section(DOCS / "solvers.md", text, START, END)
        console.print(f"wrote docs/solvers.md from {len(rows)} runs")
        return
    names = args.solvers or [*solvers.available("general"), *(n + PAGING for n in EXACT)]
    paths = sorted(GRAPHS.glob("*.json"))
    if args.graphs:
        paths = [p for p in paths if p.stem in set(args.graphs)]
    work = []
    for path in paths:
        nodes = len(json.loads(path.read_text())["nodes"])
        limit = args.large_time_limit if nodes >= LARGE_NODES else args.time_limit
        work += [(path, share, name, limit) for share in args.shares for name in names]
    where = {
        "machine": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "workers": args.workers,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    done = _kept(work)
    # Shares in the order the results already list them, then as this run's work lists them.
    shares = list(dict.fromkeys([*(r.share for r in done), *(share for _, share, _, _ in work)]))
    with Progress(console=console) as progress, ProcessPoolExecutor(args.workers) as pool:
        task = progress.add_task("solving", total=len(work))
        futures = {pool.submit(run_one, *job): job for job in work}
        for future in as_completed(futures):
            done.append(replace(future.result(), workers=args.workers))
            progress.advance(task)
            payload = {"machine": where, "rows": [asdict(r) for r in _ordered(done, shares)]}
            (RESULTS / "solvers.json").write_text(json.dumps(payload, indent=1))
    rows = _ordered(done, shares)
    scale = director_at_scale(args.shares)
    payload = {"machine": where, "rows": [asdict(r) for r in rows], "scale": scale}
    (RESULTS / "solvers.json").write_text(json.dumps(payload, indent=1))
    write_section(DOCS / "solvers.md", table(rows, where, scale), START, END)
    console.print(f"wrote benchmarks/results/solvers.json and docs/solvers.md ({len(rows)} runs)")


def _kept(work: list[tuple[Path, str, str, float]]) -> list[Row]:
    """The rows of an earlier run that this one does not redo (a run of a few solvers or
    graphs updates the results instead of replacing them)."""
    if not (RESULTS / "solvers.json").exists():
        return []
    redone = {(p.stem, share, name) for p, share, name, _ in work}
    earlier = json.loads((RESULTS / "solvers.json").read_text())["rows"]
    rows = [Row(**r) for r in earlier if r.get("file")]
    return [r for r in rows if (r.file, r.share, r.solver) not in redone]


def _ordered(rows: list[Row], shares: list[str]) -> list[Row]:
    """The rows by graph file, share (in the order of `shares`) and solver."""
    return sorted(rows, key=lambda r: (r.file, shares.index(r.share), r.solver))


if __name__ == "__main__":
    main()
