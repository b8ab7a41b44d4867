"""`python -m benchmarks.layout`: the arena of memplan's plans against their live peak.

The live peak is the most bytes live at one step, what the simulator predicts; the arena
is the highest address of the plan's layout (planner/layout.py), fragmentation included:
what one block of device memory must hold for every tensor to get an address. For each
case the arena is laid out by each layout method ("size": best fit, largest first;
"start": first fit in allocation order, like an online allocator; "best": the better of
the two, then CP-SAT where there are at most layout.EXACT_LIMIT allocations, except on a
zoo plan in live mode, whose arena is only reported), once
without fragmentation-aware planning (the budget bounds the live peak) and once with it
(the budget bounds the arena; planner/fragmentation.py).

- Zoo models (memplan.tools.zoo, at the head-to-head benchmark's sizes, benchmarks.models.SIZES):
  each is traced once with roofline node times
  (`measure=False`, so no plan depends on CPU timing noise), then planned with
  `plan_graph` and the "greedy" solver at each share of the unplanned peak, in "live"
  and "arena" fragmentation mode. Where a live budget is below greedy's least peak, the
  live mode plans that least peak instead (best effort) and the row says so; an
  InfeasibleBudget in arena mode is recorded, not raised.
- Shared graphs (the literature's checkmate training graphs and random layered graphs in
  benchmarks/graphs, general problem): the "director" solves at ceil(share x P0), the
  schedule is simulated and laid out; fragmentation-aware = `fit_arena` with the
  "tighten" move (the director again at a lower live budget). Sizes are in the graphs'
  own units, so no allocator rounding is applied.

Writes benchmarks/results/layout.json, docs/layout.md (generated from the JSON) and one
placement plot, docs/img/layout_<model>.png. Run: `python -m benchmarks.layout [--help]`.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from fractions import Fraction
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import Progress

from benchmarks.models import SIZES
from benchmarks.paths import DOCS, RESULTS, ROOT
from memplan.core import remat
from memplan.core.budget import Budget
from memplan.core.errors import InfeasibleBudget, MemplanError
from memplan.core.files import write_json_atomically
from memplan.core.graph import Graph
from memplan.core.node_link import load_node_link
from memplan.core.simulate import MemoryTrace, simulate
from memplan.core.units import format_bytes
from memplan.planner.capture import compile_training_step
from memplan.planner.fragmentation import ArenaFit, fit_arena
from memplan.planner.layout import (
    ALLOCATOR_ALIGNMENT,
    EXACT_LIMIT,
    EXACT_TIME_LIMIT,
    Layout,
    lay_out,
)
from memplan.planner.options import PlanOptions
from memplan.planner.partitioner import Partitioner
from memplan.planner.plan import plan_graph
from memplan.planner.plan_file import Plan
from memplan.solvers import SolverOptions, get_solver
from memplan.tools.report import placement_plot
from memplan.tools.zoo import ZOO

JSON = RESULTS / "layout.json"
PAGE = DOCS / "layout.md"
GRAPHS = ROOT / "benchmarks" / "graphs"  # the shared graphs, as benchmarks/solvers.py reads
GRAPH_PATTERNS = ("checkmate_*_train.json", "random_layered_n*.json")
MODELS = ("gpt2", "bert", "vit", "resnet50", "llama", "cnn")
SHARES = ("0.9", "0.8")
METHODS = ("size", "start", "best")
MODES = ("live", "arena")  # PlanOptions.fragmentation: what the budget bounds
MODEL_SOLVER, GRAPH_SOLVER = "greedy", "director"
GRAPH_MOVES = ("tighten",)  # "window" is for the training problem only
GRAPH_ALIGNMENT = 1  # the shared graphs' sizes are in their own units
TARGET = 0.05  # the issue's: the arena within 5% of the live peak on every zoo model
# The placement plot: this model's plan with this layout, live mode, at the last share.
PLOT_MODEL, PLOT_METHOD = "vit", "start"


@dataclass(frozen=True)
class Row:
    """One case (zoo model or shared graph) at one budget, laid out by one method, with
    ("arena" mode) or without ("live" mode) fragmentation-aware planning."""

    kind: str  # "model" or "graph"
    case: str  # the zoo name or the graph's file stem
    share: str
    mode: str  # "live" or "arena"
    method: str  # the layout method asked for
    budget: int
    # "planned": the live peak fits the budget; "best-effort": it does not (the least
    # peak was planned, or the director found nothing lower); "infeasible": no plan
    # (InfeasibleBudget); "no schedule": the solver returned none.
    outcome: str
    live_peak: int | None = None  # the simulator's peak
    aligned_peak: int | None = None  # the same with each allocation rounded up: the least arena
    arena: int | None = None
    layout: str = ""  # the method the layout came from ("best" resolves to one of the others)
    layout_status: str = ""  # "optimal", "feasible" or "heuristic" (Layout.status)
    moves: list[str] = field(default_factory=list)  # fragmentation-aware moves made
    overhead: float | None = None  # predicted step time (duration) over the unplanned one, - 1
    least: int | None = None  # InfeasibleBudget's least peak or arena found
    least_of: str = ""  # which: "peak" or "arena"
    solver_status: str = ""
    solve_seconds: float = 0.0  # the first solve
    wall_seconds: float = 0.0  # the whole case: plan_graph, or solve/simulate/lay out/fit
    nodes: int = 0
    allocations: int = 0
    message: str = ""

    @property
    def fragmentation(self) -> float | None:
        """Arena bytes above the live peak, as a fraction of it (as Plan.fragmentation)."""
        if self.arena is None or not self.live_peak:
            return None
        return self.arena / self.live_peak - 1

    @property
    def arena_fits(self) -> bool:
        return self.arena is not None and self.arena <= self.budget


def machine() -> dict[str, Any]:
    """Where the figures were taken."""
    return {
        "cpu": platform.processor() or platform.machine(),
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }


# --- zoo models ---------------------------------------------------------------------------


def trace_model(name: str, **size: int) -> Graph:
    """The zoo model's lowered joint graph with roofline node times (nothing measured)."""
    example = ZOO[name](**size)
    options = PlanOptions(progress=False, measure=False, layout="size")
    part = Partitioner(Budget.parse("100%"), options, name=name)
    compile_training_step(copy.deepcopy(example.model), example.inputs, part)
    return part.lowered[0].graph


def unplanned_peak(graph: Graph) -> int:
    """The simulated peak of the graph's unplanned (keep everything) schedule."""
    reference = get_solver("keep_all")(graph, None, SolverOptions())
    assert reference.schedule is not None
    return simulate(graph, reference.schedule).peak


def plan_model(
    name: str,
    graph: Graph,
    share: str,
    mode: str,
    method: str,
    time_limit: float,
    unplanned: int | None = None,
) -> tuple[Row, Plan | None]:
    """plan_graph with the greedy solver at `share` of the unplanned peak."""
    budget = Budget(fraction=Fraction(share))
    requested = budget.resolve(unplanned_peak(graph) if unplanned is None else unplanned)
    options = PlanOptions(
        solver=MODEL_SOLVER,
        time_limit=time_limit,
        measure=False,
        progress=False,
        fragmentation=mode,
        layout=method,
        best_effort=mode == "live",
    )
    row = Row("model", name, share, mode, method, requested, "", nodes=len(graph))
    started = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # best effort's warning: the row says it
            plan, _ = plan_graph(graph, budget, options, device="cpu")
    except InfeasibleBudget as error:
        of = "arena" if "feasible arena" in str(error) else "peak"
        wall = time.perf_counter() - started
        return replace(
            row,
            outcome="infeasible",
            least=error.smallest_feasible,
            least_of=of,
            wall_seconds=wall,
            message=str(error),
        ), None
    wall = time.perf_counter() - started
    row = replace(
        row,
        outcome="best-effort" if plan.status == "best-effort" else "planned",
        live_peak=plan.predicted_peak,
        aligned_peak=plan.arena_bound,
        arena=plan.arena,
        layout=plan.layout_method,
        layout_status=plan.layout_status,
        moves=list(plan.options.get("arena_moves", [])),
        overhead=plan.overhead,
        solver_status=plan.status,
        solve_seconds=plan.solve_seconds,
        wall_seconds=wall,
        allocations=len(plan.placements),
    )
    return row, plan


# --- shared graphs ------------------------------------------------------------------------


def graph_paths(stems: Sequence[str] | None = None, folder: Path = GRAPHS) -> list[Path]:
    """The shared graphs benchmarked: checkmate training graphs and random layered graphs
    (or the files named by `stems`, any graph of the folder)."""
    if stems:
        paths = [folder / f"{stem}.json" for stem in stems]
        missing = [p.name for p in paths if not p.is_file()]
        if missing:
            raise MemplanError(f"no such graph in {folder}: {', '.join(missing)}")
        return paths
    return sorted(p for pattern in GRAPH_PATTERNS for p in folder.glob(pattern))


def graph_rows(
    path: Path,
    shares: Sequence[str],
    methods: Sequence[str],
    time_limit: float,
    advance: Callable[[str], None] = lambda _: None,
) -> list[Row]:
    """The director's schedule at each share, laid out by each method without and with
    fit_arena; `advance(label)` after each method."""
    graph = load_node_link(path)
    unplanned = simulate(graph, remat.to_schedule(graph, range(len(graph)))).time
    options = SolverOptions(problem="general", time_limit=time_limit)
    director = get_solver(GRAPH_SOLVER)
    rows: list[Row] = []
    for share in shares:
        budget = remat.resolve_budget(graph, share)
        started = time.perf_counter()
        first = director(graph, budget, options)
        solved = time.perf_counter() - started
        base = Row(
            "graph",
            path.stem,
            share,
            "",
            "",
            budget,
            "",
            solver_status=first.status,
            solve_seconds=solved,
            nodes=len(graph),
        )
        if first.schedule is None:
            for method in methods:
                rows += [
                    replace(
                        base, mode=mode, method=method, outcome="no schedule", message=first.message
                    )
                    for mode in MODES
                ]
                advance(f"{path.stem} at {share}: {method}")
            continue
        trace = simulate(graph, first.schedule)
        for method in methods:
            started = time.perf_counter()
            layout = lay_out(trace.allocations, method, alignment=GRAPH_ALIGNMENT)
            live_wall = solved + time.perf_counter() - started
            rows.append(_graph_row(base, "live", method, trace, layout, (), unplanned, live_wall))
            started = time.perf_counter()
            fit = fit_arena(
                graph,
                budget,
                ArenaFit(first, trace, layout, ()),
                lambda live_budget: director(graph, live_budget, options),
                options,
                method=method,
                alignment=GRAPH_ALIGNMENT,
                moves=GRAPH_MOVES,
            )
            # Arena mode's time: the solve, the first layout and the moves.
            wall = live_wall + time.perf_counter() - started
            rows.append(
                _graph_row(base, "arena", method, fit.trace, fit.layout, fit.moves, unplanned, wall)
            )
            advance(f"{path.stem} at {share}: {method}")
    return rows


def _graph_row(
    base: Row,
    mode: str,
    method: str,
    trace: MemoryTrace,
    layout: Layout,
    moves: Sequence[str],
    unplanned: float,
    wall: float,
) -> Row:
    """`base` with one layout's figures; `unplanned` is the reference order's duration."""
    return replace(
        base,
        mode=mode,
        method=method,
        outcome="planned" if trace.peak <= base.budget else "best-effort",
        live_peak=trace.peak,
        aligned_peak=layout.live_peak,
        arena=layout.arena,
        layout=layout.method,
        layout_status=layout.status,
        moves=list(moves),
        overhead=trace.time / unplanned - 1 if unplanned else None,
        wall_seconds=wall,
        allocations=len(layout.offsets),
    )


# --- the verdicts -------------------------------------------------------------------------


def _worst(rows: Sequence[Row], method: str) -> Row | None:
    """The row of `method` with the most fragmentation among those with a layout."""
    laid = [r for r in rows if r.method == method and r.fragmentation is not None]
    return max(laid, key=lambda r: r.fragmentation or 0.0, default=None)


def within(row: Row, target: float = TARGET) -> bool:
    """arena <= (1 + target) x live peak, exactly (5% of 1000 bytes is 1050, not above)."""
    assert row.arena is not None and row.live_peak
    return Fraction(row.arena, row.live_peak) <= 1 + Fraction(str(target))


def mode_verdict(rows: Sequence[Row], target: float = TARGET) -> tuple[bool | None, str]:
    """Whether some layout method keeps the arena within `target` of the live peak at
    every budget of these rows (one model, one mode), and the sentence that says so: the
    best method's worst case, then each method's, a miss by how many points. None: no
    budget has a plan."""
    methods = list(dict.fromkeys(r.method for r in rows))
    worst = {m: w for m in methods if (w := _worst(rows, m)) is not None}
    if not worst:
        return None, f"no plan at any budget{_why_unplanned(rows)}"
    best = min(worst, key=lambda m: (worst[m].fragmentation, methods.index(m)))
    frag = worst[best].fragmentation
    assert frag is not None
    met = within(worst[best], target)
    if met:
        text = f"met: `{best}` at most {frag:.2%}"
    else:
        text = f"missed by {(frag - target) * 100:.2f} points: `{best}` at most {frag:.2%}"
    parts = []
    for m in methods:
        if m not in worst:
            parts.append(f"`{m}` no plan")
            continue
        w = worst[m]
        assert w.fragmentation is not None
        over = "" if within(w, target) else f", {(w.fragmentation - target) * 100:.2f} over"
        parts.append(f"`{m}` {w.fragmentation:.2%} (at {w.share}{over})")
    unplanned = sorted({r.share for r in rows if r.arena is None})
    gaps = f"; no plan at {', '.join(unplanned)}{_why_unplanned(rows)}" if unplanned else ""
    effort = sorted({r.share for r in rows if r.outcome == "best-effort"})
    efforts = ""
    if effort:
        least = max(r.live_peak or 0 for r in rows if r.outcome == "best-effort")
        efforts = (
            f"; at {', '.join(effort)} the budget is below the least peak found, "
            f"{format_bytes(least)}: best-effort plans of that peak"
        )
    return met, f"{text} (worst per method: {', '.join(parts)}{gaps}{efforts})"


def _why_unplanned(rows: Sequence[Row]) -> str:
    """What InfeasibleBudget said for the rows without a plan: the least peak or arena."""
    least = [r for r in rows if r.arena is None and r.least is not None]
    if not least:
        return ""
    low = min(least, key=lambda r: r.least or 0)
    assert low.least is not None
    return f" (infeasible: the least {low.least_of} found is {format_bytes(low.least)})"


def verdicts(rows: Sequence[Row], target: float = TARGET) -> list[str]:
    """The target on every zoo model: an overall line per mode, then one line per model."""
    models = list(dict.fromkeys(r.case for r in rows if r.kind == "model"))
    if not models:
        return ["No zoo model was run."]
    found: dict[tuple[str, str], tuple[bool | None, str]] = {}
    for model in models:
        for mode in MODES:
            chosen = [r for r in rows if r.kind == "model" and r.case == model and r.mode == mode]
            if chosen:
                found[model, mode] = mode_verdict(chosen, target)
    lines = []
    for mode in MODES:
        judged = [(m, found[m, mode][0]) for m in models if (m, mode) in found]
        if not judged:
            continue
        met = [m for m, ok in judged if ok]
        missed = [m for m, ok in judged if ok is False]
        unplanned = [m for m, ok in judged if ok is None]
        if len(met) == len(judged):
            text = f"met on every model ({len(met)} of {len(judged)})"
        else:
            text = f"not met on every model: met on {len(met)} of {len(judged)}"
            text += f"; missed on {', '.join(missed)}" if missed else ""
            text += f"; no plan to judge on {', '.join(unplanned)}" if unplanned else ""
        lines.append(f"- **{_MODE_NAMES[mode]}**: {text}.")
    zoo = [r for r in rows if r.kind == "model" and r.fragmentation is not None]
    worst = []
    for method in dict.fromkeys(r.method for r in zoo):
        w = _worst(zoo, method)
        assert w is not None and w.fragmentation is not None
        over = sorted({r.case for r in zoo if r.method == method and not within(r, target)})
        where = f"above {target:.0%} on {', '.join(over)}" if over else f"within {target:.0%}"
        worst.append(
            f"`{method}` {w.fragmentation:.2%} ({w.case} at {w.share}, {w.mode} mode; {where})"
        )
    if worst:
        lines.append(f"- Most fragmentation over every zoo plan, by layout: {'; '.join(worst)}.")
    lines += _arena_mode_lines(rows)
    lines.append("")
    for model in models:
        for mode in MODES:
            if (model, mode) in found:
                lines.append(f"- {model}, {_MODE_NAMES[mode]}: {found[model, mode][1]}.")
    return lines


def _arena_mode_lines(rows: Sequence[Row], kind: str = "model") -> list[str]:
    """What fragmentation-aware planning did for the cases of `kind` whose live peak fits
    the budget but whose live-mode arena does not."""
    by = {(r.case, r.share, r.method, r.mode): r for r in rows if r.kind == kind}
    planned = [r for r in rows if r.kind == kind and r.mode == "live" and r.outcome == "planned"]
    over = [r for r in planned if not r.arena_fits]
    what = "plans" if kind == "model" else "schedules"
    if not planned:
        return []
    if not over:
        return [f"- In live mode every arena fits its budget ({len(planned)} {what})."]
    fixed, failed, costs = [], [], []
    for r in over:
        aware = by.get((r.case, r.share, r.method, "arena"))
        name = f"{r.case} at {r.share} `{r.method}`"
        if aware is None or not aware.arena_fits:
            failed.append(name)
            continue
        moves = ", ".join(aware.moves) or "none"
        fixed.append(f"{name} ({moves})" if kind == "model" else name)
        if aware.overhead is not None and r.overhead is not None:
            costs.append((aware.overhead - r.overhead) * 100)
    text = (
        f"- In live mode {len(over)} of {len(planned)} {what} within their budget have an "
        f"arena above it; arena mode fits {len(fixed)} of them"
    )
    text += f": {'; '.join(fixed)}" if fixed and kind == "model" else ""
    if costs:
        cost = "predicted step time" if kind == "model" else "TDI"
        text += (
            f", adding {min(costs):.2f} to {max(costs):.2f} points of {cost} over the live-mode one"
        )
    text += f"; it does not fit {'; '.join(failed)}" if failed else ""
    return [text + "."]


def graph_summary(rows: Sequence[Row]) -> list[str]:
    """The shared graphs in a few lines: each method's fragmentation, and arena mode."""
    graphs = [r for r in rows if r.kind == "graph" and r.mode == "live" and r.arena is not None]
    if not graphs:
        return []
    lines = []
    for method in dict.fromkeys(r.method for r in graphs):
        chosen = [r for r in graphs if r.method == method]
        w = _worst(chosen, method)
        assert w is not None and w.fragmentation is not None
        at_peak = sum(r.arena == r.live_peak for r in chosen)
        lines.append(
            f"`{method}` at most {w.fragmentation:.2%} ({w.case} at {w.share}), at the live "
            f"peak on {at_peak} of {len(chosen)}"
        )
    return [
        f"- Director schedules laid out: {'; '.join(lines)}.",
        *_arena_mode_lines(rows, "graph"),
    ]


_MODE_NAMES = {"live": "live mode", "arena": "arena mode"}


# --- the page -----------------------------------------------------------------------------


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:+.2%}"


def _yes(row: Row) -> str:
    return "—" if row.arena is None else ("yes" if row.arena_fits else "**no**")


def _layout(row: Row) -> str:
    if not row.layout:
        return "—"
    used = row.layout if row.layout == row.method else f"{row.method} → {row.layout}"
    return f"{used} ({row.layout_status})"


def _model_cells(row: Row | None, aware: bool) -> list[str]:
    """live peak, arena, fragmentation, [rounding or moves,] time, fits."""
    if row is None:
        return ["—"] * 6
    if row.arena is None:
        least = "" if row.least is None else f": least {row.least_of} {format_bytes(row.least)}"
        return [f"{row.outcome}{least}", *(["—"] * 5)]
    assert row.live_peak is not None and row.aligned_peak is not None
    peak = format_bytes(row.live_peak) + (" (best effort)" if row.outcome == "best-effort" else "")
    cells = [peak, format_bytes(row.arena), _percent(row.fragmentation)]
    if aware:
        cells.append(", ".join(row.moves) or "none")
    else:
        cells.append(_percent(row.aligned_peak / row.live_peak - 1))
    return [*cells, _percent(row.overhead), _yes(row)]


def _graph_cells(row: Row | None, aware: bool) -> list[str]:
    """live / budget, arena / budget, fragmentation, [moves,] TDI, fits."""
    width = 6 if aware else 5
    if row is None or row.arena is None or row.live_peak is None:
        return [row.outcome if row else "—", *(["—"] * (width - 1))]
    cells = [
        f"{row.live_peak / row.budget:.3f}",
        f"{row.arena / row.budget:.3f}",
        _percent(row.fragmentation),
    ]
    if aware:
        cells.append(", ".join(row.moves) or "none")
    return [*cells, _percent(row.overhead), _yes(row)]


def _table_head(first: list[str], header: list[str], aware: list[str]) -> list[str]:
    """A markdown table's two head lines: `first` columns, then live mode's `header`
    columns, then arena mode's `aware` columns, marked "aware:"."""
    columns = [*first, *header, *(f"aware: {h}" for h in aware)]
    return ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]


def _paired(rows: Sequence[Row], kind: str) -> list[tuple[Row, Row | None, Row | None]]:
    """(any row, live-mode row, arena-mode row) per case, share and method, in run order."""
    keys = list(dict.fromkeys((r.case, r.share, r.method) for r in rows if r.kind == kind))
    by = {(r.case, r.share, r.method, r.mode): r for r in rows if r.kind == kind}
    pairs = []
    for case, share, method in keys:
        live, arena = by.get((case, share, method, "live")), by.get((case, share, method, "arena"))
        first = live or arena
        assert first is not None
        pairs.append((first, live, arena))
    return pairs


def markdown(data: dict[str, Any]) -> str:
    """docs/layout.md from the saved figures."""
    rows = [Row(**r) for r in data["rows"]]
    where = data["machine"]
    minutes = data["wall_seconds"] / 60
    lines = [
        "# Arena against live peak: fragmentation of memplan's plans",
        "",
        "Written by `python -m benchmarks.layout`; raw figures in "
        "`benchmarks/results/layout.json`. Do not edit by hand.",
        "",
        "The **live peak** is the most bytes live at one step of a plan, what the simulator "
        "predicts and what a budget bounds by default. The **arena** is the highest address "
        "of the plan's layout (`planner/layout.py`): every allocation gets an offset so that "
        "no two allocations live at the same step share an address, and the arena is the one "
        "contiguous block they all fit in. The live peak is a lower bound on it; "
        "**fragmentation** is the arena's excess over the live peak, as a fraction of the "
        "live peak (`Plan.fragmentation`). For the zoo models every allocation is rounded up "
        f"to {ALLOCATOR_ALIGNMENT} bytes as the CUDA caching allocator rounds blocks, and "
        "that rounding counts as fragmentation here.",
        "",
        "Layout methods: `size` places the largest allocation first, each into the smallest "
        "gap that fits (best fit); `start` places them in allocation order into the lowest "
        "gap that fits (first fit, what an online allocator that never moves a block does); "
        "`best`, the default, takes the better of the two and then runs CP-SAT (no-overlap "
        f"in 2-D, {EXACT_TIME_LIMIT:g} s, the layout's own limit; a zoo plan's is the "
        "solver's time limit where that is lower) where "
        f"there are at most {EXACT_LIMIT} allocations "
        "and the heuristic is above the live peak; a zoo plan in live mode, whose arena "
        "the budget does not bound, keeps the better heuristic. A layout's status: "
        "`optimal` (at the live "
        "peak, or proved by CP-SAT), `feasible` (CP-SAT, not proved), `heuristic`.",
        "",
        'Without fragmentation-aware planning (**live mode**, `fragmentation="live"`) the '
        "budget bounds the live peak and the arena may exceed it (`fits`: the arena is "
        'within the budget). With it (**arena mode**, `fragmentation="arena"`, '
        "`planner/fragmentation.py`) the budget bounds the arena: while the arena is above "
        "it, memplan releases the cheapest contiguous window of saved tensors under the "
        "arena's top (`window`, Coop's sliding window, training problem only) or solves again "
        "at a live budget lowered by the excess (`tighten`); the moves made are listed. The "
        "layout method stays the one asked for.",
        "",
        f"{_sizes(data.get('sizes'))} Each is traced once with roofline node times "
        "(`measure=False`), so that no plan depends on CPU timing noise; then `plan_graph` "
        f"with the `{MODEL_SOLVER}` solver at each share of the unplanned peak, once per "
        "layout method and mode. Where a budget is below greedy's least peak, live mode "
        "plans that least peak instead (best effort, marked) and arena mode records the "
        "`InfeasibleBudget`. `time` is the predicted step-time increase over the unplanned "
        "step. Shared graphs (`benchmarks/graphs`, the literature's checkmate training graphs "
        f"and random layered graphs, general problem): the `{GRAPH_SOLVER}` solves at "
        "ceil(share x P0), the schedule is simulated and laid out by each method; arena mode "
        "is `fit_arena` with the `tighten` move, re-solving with the director. Their sizes "
        "are in the graphs' own units, so no rounding is applied, and peaks are shown over "
        "the budget; TDI is the duration increase over the reference order.",
        "",
        "**CPU only.** Nothing here was run on a device: live peaks and arenas are "
        "predictions. On CPU there is no caching allocator between the program and memory, "
        "and the allocator's events (read through the profiler) check the live peak "
        "([measurement](measurement.md)) but say nothing about an arena. On a GPU "
        "the arena would be compared with the caching allocator's `max_memory_reserved` against "
        "`max_memory_allocated`; that comparison was not done"
        + (" (no GPU on this machine)." if not where.get("cuda") else "."),
        "",
        f"Machine: {where['cpu']}, {where['cpu_cores']} CPU cores, torch {where['torch']} "
        f"({where['torch_threads']} threads), Python {where['python']}, {where['date']}; "
        f"solver time limit {data['time_limit']:g} s. The whole run took {minutes:.1f} min.",
        "",
        f"## Verdicts: arena within {TARGET:.0%} of the live peak on every zoo model",
        "",
        f"A model meets the target in a mode when some layout method keeps its arena within "
        f"{TARGET:.0%} of the predicted live peak at every budget; misses are in percentage "
        "points of the live peak above the target.",
        "",
        *verdicts(rows),
        "",
    ]
    if data.get("plot"):
        plot = data["plot"]
        lines += [
            "## Where the allocations lie",
            "",
            f"{plot['model']} at {plot['share']} of the unplanned peak, `{plot['method']}` "
            f"layout, {plot['mode']} mode: arena {format_bytes(plot['arena'])} against a live "
            f"peak of {format_bytes(plot['live_peak'])}. Each rectangle is one allocation, "
            f"live over its steps (x) at its addresses (y).{_others(rows, plot)}",
            "",
            f"![{plot['model']}: placements]({plot['path']})",
            "",
        ]
    header = ["live peak", "arena", "frag.", "of which rounding", "time", "fits"]
    aware = ["live peak", "arena", "frag.", "moves", "time", "fits"]
    lines += [
        "## Zoo models",
        "",
        "Left: live mode; right (aware: ...): arena mode. Budgets are shares of the unplanned "
        f"peak. `of which rounding`: the live peak with every allocation rounded up to "
        f"{ALLOCATOR_ALIGNMENT} bytes over the live peak, the part of the fragmentation no "
        "layout avoids. `time`: predicted step time over the unplanned step.",
        "",
        *_table_head(["model", "budget", "layout"], header, aware),
    ]
    for first, live, arena in _paired(rows, "model"):
        budget = f"{first.share} ({format_bytes(first.budget)})"
        lines.append(
            f"| {first.case} | {budget} | {_layout(live or first)} | "
            + " | ".join([*_model_cells(live, False), *_model_cells(arena, True)])
            + " |"
        )
    header = ["live / budget", "arena / budget", "frag.", "TDI", "fits"]
    aware = ["live / budget", "arena / budget", "frag.", "moves", "TDI", "fits"]
    lines += [
        "",
        "## Shared graphs",
        "",
        "Left: the director's schedule laid out; right (aware: ...): after `fit_arena`. "
        "`director` is the first solve's status and wall time.",
        "",
        *graph_summary(rows),
        "",
        *_table_head(["graph", "nodes", "budget", "director", "layout"], header, aware),
    ]
    for first, live, arena in _paired(rows, "graph"):
        director = f"{first.solver_status}, {first.solve_seconds:.2f} s"
        lines.append(
            f"| {first.case} | {first.nodes} | {first.share} | {director} | "
            f"{_layout(live or first)} | "
            + " | ".join([*_graph_cells(live, False), *_graph_cells(arena, True)])
            + " |"
        )
    lines.append("")
    return "\n".join(lines)


def _sizes(sizes: dict[str, dict[str, int]] | None) -> str:
    """The sentence on the zoo models' sizes as run: the head-to-head benchmark's, or others
    (the zoo's defaults where a figures file records none)."""
    if not sizes:
        return "Zoo models (`memplan.tools.zoo`) at the zoo's default sizes."
    listed = "; ".join(
        f"{name} {', '.join(f'{k} {v}' for k, v in size.items()) or 'at its defaults'}"
        for name, size in sizes.items()
    )
    if all(SIZES.get(name) == size for name, size in sizes.items()):
        return (
            "Zoo models (`memplan.tools.zoo`) at the sizes of the head-to-head benchmark "
            f"([results](results.md), `benchmarks.models.SIZES`): {listed}."
        )
    return f"Zoo models (`memplan.tools.zoo`) at these sizes: {listed}."


def _others(rows: Sequence[Row], plot: dict[str, Any]) -> str:
    """The other layout methods' arenas for the plotted plan's case, share and mode."""
    others = [
        r
        for r in rows
        if (r.kind, r.case, r.share, r.mode)
        == ("model", plot["model"], plot["share"], plot["mode"])
        and r.method != plot["method"]
        and r.arena is not None
    ]
    if not others:
        return ""
    found = [
        f"`{r.method}` {format_bytes(r.arena or 0)} ({_percent(r.fragmentation)})" for r in others
    ]
    return f" The other layouts of this case: {', '.join(found)}."


def write_outputs(data: dict[str, Any], json_path: Path = JSON, page: Path = PAGE) -> None:
    """The JSON, then the page generated from it."""
    write_json_atomically(json_path, data)
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(markdown(data))


# --- the run ------------------------------------------------------------------------------


def run(
    models: Sequence[str],
    graphs: Sequence[Path],
    shares: Sequence[str],
    methods: Sequence[str],
    time_limit: float,
    *,
    sizes: dict[str, dict[str, int]] | None = None,
    plot: tuple[str, str] | None = (PLOT_MODEL, PLOT_METHOD),
    image_dir: Path = DOCS / "img",
    console: Console | None = None,
) -> dict[str, Any]:
    """Every case; the figures as layout.json holds them. The zoo models are built at
    `sizes` (name to ZOO keyword arguments; a model not named takes the zoo's defaults),
    by default the head-to-head benchmark's, benchmarks.models.SIZES. `plot` (model,
    method) draws that model's live-mode plan at the last share under `image_dir`, if
    the model runs."""
    started = time.perf_counter()
    built = {name: dict((SIZES if sizes is None else sizes).get(name, {})) for name in models}
    rows: list[Row] = []
    drawn: dict[str, Any] | None = None
    per_model = len(shares) * len(MODES) * len(methods)
    with Progress(console=console or Console()) as progress:
        total = len(models) * (per_model + 1) + len(graphs) * len(shares) * len(methods)
        task = progress.add_task("benchmarking", total=total)
        for name in models:
            progress.update(task, description=f"tracing {name}")
            graph = trace_model(name, **built[name])
            unplanned = unplanned_peak(graph)
            progress.advance(task)
            for share in shares:
                for mode in MODES:
                    for method in methods:
                        progress.update(task, description=f"{name} at {share}: {mode}, {method}")
                        row, plan = plan_model(
                            name, graph, share, mode, method, time_limit, unplanned
                        )
                        rows.append(row)
                        progress.advance(task)
                        wanted = plot is not None and (name, method) == plot
                        if wanted and mode == "live" and share == shares[-1] and plan:
                            path = image_dir / f"layout_{name}.png"
                            path.parent.mkdir(parents=True, exist_ok=True)
                            placement_plot(plan, path)
                            drawn = {
                                "model": name,
                                "share": share,
                                "mode": mode,
                                "method": method,
                                "arena": plan.arena,
                                "live_peak": plan.predicted_peak,
                                "path": f"img/{path.name}",
                            }
        for path in graphs:

            def advance(label: str) -> None:
                progress.update(task, advance=1, description=label)

            rows += graph_rows(path, shares, methods, time_limit, advance)
    return {
        "machine": machine(),
        "time_limit": time_limit,
        "target": TARGET,
        "sizes": built,
        "wall_seconds": time.perf_counter() - started,
        "plot": drawn,
        "rows": [asdict(r) for r in rows],
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", default=",".join(MODELS), help="comma-separated zoo names ('' for none)"
    )
    parser.add_argument(
        "--graphs",
        default=None,
        help="comma-separated graph file stems of benchmarks/graphs ('' for none); default: "
        "the checkmate training graphs and the random layered graphs",
    )
    parser.add_argument("--budgets", default=",".join(SHARES), help="shares, comma-separated")
    parser.add_argument(
        "--methods", default=",".join(METHODS), help="layout methods: size, start, exact, best"
    )
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds per solve")
    parser.add_argument("--json", type=Path, default=JSON, help="where the figures go")
    parser.add_argument("--page", type=Path, default=PAGE, help="where the page goes")
    parser.add_argument("--img", type=Path, default=DOCS / "img", help="where the plot goes")
    parser.add_argument(
        "--plot",
        default=f"{PLOT_MODEL}:{PLOT_METHOD}",
        help="MODEL:METHOD whose live-mode plan at the last budget is drawn ('' for none)",
    )
    parser.add_argument("--report-only", action="store_true", help="rewrite the page from JSON")
    args = parser.parse_args(argv)
    console = Console()
    if args.report_only:
        args.page.write_text(markdown(json.loads(args.json.read_text())))
        console.print(f"wrote {args.page}")
        return
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - set(ZOO))
    if unknown:
        parser.error(f"unknown models {unknown}; choose from {sorted(ZOO)}")
    methods = [m for m in args.methods.split(",") if m]
    if bad := sorted(set(methods) - {"size", "start", "exact", "best"}):
        parser.error(f"unknown layout methods {bad}")
    shares = [s for s in args.budgets.split(",") if s]
    for share in shares:
        try:
            ok = 0 < Fraction(share) <= 1
        except ValueError:
            ok = False
        if not ok:
            parser.error(f"a budget is a share of the peak in (0, 1], got {share!r}")
    stems = None if args.graphs is None else [g for g in args.graphs.split(",") if g]
    try:
        graphs = graph_paths(stems) if stems is None or stems else []
    except MemplanError as error:
        parser.error(str(error))
    plot = None
    if args.plot:
        model, _, method = args.plot.partition(":")
        plot = (model, method or PLOT_METHOD)
    data = run(
        models,
        graphs,
        shares,
        methods,
        args.time_limit,
        plot=plot,
        image_dir=args.img,
        console=console,
    )
    write_outputs(data, args.json, args.page)
    console.print(
        f"wrote {args.json} and {args.page} ({len(data['rows'])} rows, "
        f"{data['wall_seconds'] / 60:.1f} min)"
    )


if __name__ == "__main__":
    main()
