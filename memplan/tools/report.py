"""Human-readable views of a Plan (rich tables for the terminal, a memory-timeline plot and
a plot of where its allocations lie in the arena) and of a largest-batch search."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba_array
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from rich.markup import escape
from rich.table import Table

from memplan.core.errors import MemplanError
from memplan.core.files import write_atomically
from memplan.core.graph import Decision
from memplan.core.units import format_bytes, format_seconds
from memplan.planner.layout import ALLOCATOR_ALIGNMENT
from memplan.planner.plan_file import Plan
from memplan.tools.batch_search import MaxBatch

if TYPE_CHECKING:  # types only: reports need no torch to load
    from memplan.tools.fit import Fit
    from memplan.tools.verify import Verification

MIB = 2**20
AT_PEAK_SHOWN = 5  # groups of blocks a failed check lists from the measured peak
_STYLE = {Decision.KEEP: "green", Decision.RECOMPUTE: "yellow", Decision.OFFLOAD: "cyan"}


def summary_table(plan: Plan) -> Table:
    """Budget, peaks, times and decision counts of one plan, one row each."""
    table = Table(title=f"memplan: {escape(plan.name)}", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    share = plan.predicted_peak / plan.unplanned_peak if plan.unplanned_peak else 0.0
    counts = plan.counts()
    table.add_row("device", plan.device)
    table.add_row("budget", _budget_text(plan))
    table.add_row("unplanned peak", format_bytes(plan.unplanned_peak))
    table.add_row(
        "predicted peak", f"{format_bytes(plan.predicted_peak)} ({share:.1%} of unplanned)"
    )
    if plan.compiled_peak:
        table.add_row("as Inductor compiled it", format_bytes(plan.compiled_peak))
    if plan.resident:
        table.add_row("held by earlier graphs", format_bytes(plan.resident))
    if plan.outside:
        table.add_row("held outside the graphs", format_bytes(plan.outside))
    if plan.resident or plan.outside:
        table.add_row("step's predicted peak", format_bytes(plan.step_peak))
    if plan.arena > 0:  # plan files written before layouts have no arena
        over = ", [red]above the budget[/]" if plan.arena > plan.budget else ""
        status = f", {escape(plan.layout_status)}" if plan.layout_status else ""
        table.add_row(
            "arena",
            f"{format_bytes(plan.arena)} ({escape(plan.layout_method)} layout{status}{over})",
        )
        rounding = ""
        if plan.arena_bound:  # plans written before the bound was recorded have none
            share = plan.arena_bound / plan.predicted_peak - 1 if plan.predicted_peak else 0.0
            rounding = f" ({ALLOCATOR_ALIGNMENT}-byte rounding alone: {share:.2%})"
        table.add_row(
            "fragmentation", f"{plan.fragmentation:.2%} above the predicted peak{rounding}"
        )
    table.add_row("unplanned time", format_seconds(plan.unplanned_time))
    table.add_row(
        "predicted time", f"{format_seconds(plan.predicted_time)} ({plan.overhead:+.1%} overhead)"
    )
    table.add_row("solver", plan.solver)
    table.add_row("status", plan.status)
    table.add_row("solve time", format_seconds(plan.solve_seconds))
    table.add_row("decisions", ", ".join(f"{n} {d}" for d, n in counts.items()))
    if plan.note:
        table.add_row("note", escape(plan.note))
    return table


def _budget_text(plan: Plan) -> str:
    """The budget the plan holds, and the one asked for where that is another."""
    asked = format_bytes(plan.asked)
    if plan.requested_as and plan.requested_as != asked:
        asked = f"{asked} ({plan.requested_as})"
    if plan.budget == plan.asked:
        return asked
    return f"{format_bytes(plan.budget)} (asked: {asked}, which no schedule found meets)"


def verification_table(check: Verification) -> Table:
    """A plan's check on the real model: measured peaks next to the prediction."""
    table = Table(title="checked on the model", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    verdict = "[green]ok[/]" if check.ok else "[red]failed[/]"
    table.add_row("eager peak", f"{format_bytes(check.eager_peak)} (measured, {check.method})")
    table.add_row(
        "planned peak",
        f"{format_bytes(check.measured_peak)} (measured; predicted "
        f"{format_bytes(check.predicted_peak)}, {check.prediction_error:+.2%})",
    )
    if check.tracker_peak:
        table.add_row(
            "kernels' own buffers",
            f"{format_bytes(check.kernel_buffers)} at the peak (the live-storage tracker "
            f"sees {format_bytes(check.tracker_peak)})",
        )
    table.add_row("within budget", "yes" if check.within_budget else "[red]no[/]")
    table.add_row(
        "gradients",
        f"{'equal to eager' if check.grads_match else '[red]differ[/]'} "
        f"(max abs difference {check.max_grad_error:.3g})",
    )
    table.add_row("verdict", verdict)
    if check.at_peak:
        # A failed check says what the planned step held at its peak, the largest first.
        table.add_row(
            "held at the measured peak",
            "\n".join(
                f"{g.count} x {format_bytes(g.nbytes)} by {escape(g.site)}"
                for g in check.at_peak[:AT_PEAK_SHOWN]
            ),
        )
    return table


def fit_table(found: Fit) -> Table:
    """What a step's peak is made of, unplanned and planned, against the budget; the
    plan's predicted time, or where nothing fits, the bound and what dominates it."""
    title = f"will it fit? {escape(found.name)} on {escape(found.device)}"
    ranks = found.state.ranks
    if ranks > 1:
        title += f", per rank of {ranks} (FSDP)"
    table = Table(title=title, title_justify="left")
    table.add_column("peak made of", style="bold")
    table.add_column("unplanned", justify="right")
    table.add_column("planned", justify="right")
    planned = found.planned.parts() if found.planned else {}
    for part, size in found.unplanned.parts().items():
        if not size and not planned.get(part):
            continue  # a part this step does not have (master copies in fp32, say)
        table.add_row(part, format_bytes(size), format_bytes(planned[part]) if planned else "-")
    total = format_bytes(found.planned.total) if found.planned else "-"
    table.add_row("peak", format_bytes(found.unplanned.total), total, style="bold")
    table.add_row("budget", format_bytes(found.budget), format_bytes(found.budget))
    if found.plan is not None:
        plan = found.plan
        table.add_row(
            "step time (roofline)",
            format_seconds(plan.unplanned_time),
            f"{format_seconds(plan.predicted_time)} ({plan.overhead:+.1%})",
        )
    return table


def fit_verdict(found: Fit) -> str:
    """One line: fits with what overhead, or why nothing fits and what dominates."""
    part, size = found.dominant()
    if found.plan is not None and found.planned is not None:
        return (
            f"[green]fits[/]: predicted peak {format_bytes(found.planned.total)} "
            f"within {format_bytes(found.budget)}, {found.plan.overhead:+.1%} step time "
            f"({escape(found.plan.solver)}, planned in {format_seconds(found.seconds)})"
        )
    if found.least is None:
        return (
            f"[red]does not fit[/] in {format_bytes(found.budget)}: no plan can peak below "
            f"{format_bytes(found.bound)} (proved: what the step holds at its end), of which "
            f"{part} is the largest part, {format_bytes(size)}"
        )
    return (
        f"[red]does not fit[/] in {format_bytes(found.budget)}: the least peak found is "
        f"{format_bytes(found.least)}; {part} is the largest part of the unplanned peak, "
        f"{format_bytes(size)}"
    )


def maxbatch_table(results: Sequence[MaxBatch]) -> Table:
    """Each method's largest batch under the cap, against eager's."""
    table = Table(title=f"largest batch under {format_bytes(results[0].cap_bytes)}")
    for column in ("method", "largest batch", "vs eager", "step time", "setting"):
        table.add_column(column)
    eager = next((r.batch for r in results if r.method == "eager"), 0)
    for r in results:
        ratio = f"{r.batch / eager:.2f}x" if eager else "-"
        seconds = "-" if r.step_seconds is None else format_seconds(r.step_seconds)
        table.add_row(r.method, str(r.batch), ratio, seconds, r.setting or "-")
    return table


def decision_table(plan: Plan, top: int | None = None) -> Table:
    """One row per saved tensor, largest first; `top` keeps only the first rows."""
    rows = sorted(plan.decisions.items(), key=lambda kv: (-plan.tensor_bytes.get(kv[0], 0), kv[0]))
    shown = rows if top is None else rows[: max(top, 0)]
    table = Table(title="saved tensors", title_justify="left")
    table.add_column("tensor")
    table.add_column("bytes", justify="right")
    table.add_column("decision")
    for name, decision in shown:
        size = format_bytes(plan.tensor_bytes.get(name, 0))
        style = _STYLE[Decision(decision)]
        table.add_row(escape(name), size, f"[{style}]{decision}[/]")
    if len(shown) < len(rows):
        table.caption = f"{len(rows) - len(shown)} more not shown"
    return table


def plot_timeline(
    plans_or_plan: Plan | Sequence[Plan], path: str | Path, *, measured_peak: int | None = None
) -> None:
    """Write a PNG of predicted live MiB over predicted compute time, unplanned vs planned.

    With several plans (of one model), the unplanned step of the first is drawn once and
    each plan gets its own curve, budget line and backward-start line. `measured_peak` is
    the first plan's measured peak, drawn as a marker at its predicted peak's time.
    """
    plans = [plans_or_plan] if isinstance(plans_or_plan, Plan) else list(plans_or_plan)
    if not plans:
        raise ValueError("plot_timeline needs at least one plan")
    # A graph profiled with no times has an all-zero clock: fall back to step indices.
    use_clock = all(_has_clock(p.clock, p.timeline) for p in plans)
    use_clock = use_clock and _has_clock(plans[0].unplanned_clock, plans[0].unplanned_timeline)
    figure = Figure(figsize=(9, 4.5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()

    first = plans[0]
    xs = _xs(first.unplanned_clock, len(first.unplanned_timeline), use_clock)
    axes.plot(
        xs,
        [b / MIB for b in first.unplanned_timeline],
        drawstyle="steps-post",
        color="0.55",
        label=f"unplanned (peak {format_bytes(first.unplanned_peak)})",
    )
    for index, plan in enumerate(plans):
        color = f"C{index}"
        xs = _xs(plan.clock, len(plan.timeline), use_clock)
        label = f"{plan.solver} (peak {format_bytes(plan.predicted_peak)})"
        axes.plot(
            xs, [b / MIB for b in plan.timeline], drawstyle="steps-post", color=color, label=label
        )
        axes.axhline(
            plan.budget / MIB,
            color=color,
            linestyle="--",
            linewidth=1,
            label=f"budget {format_bytes(plan.budget)}",
        )
        if 0 < plan.backward_start <= len(xs):
            axes.axvline(
                xs[plan.backward_start - 1],
                color=color,
                linestyle=":",
                linewidth=1,
                label="backward starts" if index == 0 else None,
            )
        if index == 0 and measured_peak is not None and plan.timeline:
            at = xs[max(range(len(plan.timeline)), key=plan.timeline.__getitem__)]
            axes.plot(
                [at],
                [measured_peak / MIB],
                marker="x",
                markersize=10,
                linestyle="none",
                color="black",
                label=f"measured peak {format_bytes(measured_peak)}",
            )

    axes.set_xlabel("predicted compute time (ms)" if use_clock else "step")
    axes.set_ylabel("live device memory (MiB)")
    names = dict.fromkeys(p.name for p in plans)
    axes.set_title(f"memory timeline: {', '.join(names)}")
    axes.set_ylim(bottom=0)
    axes.grid(alpha=0.3)
    axes.legend(loc="best", fontsize="small")
    write_atomically(path, lambda out: figure.savefig(out, format="png", dpi=120), binary=True)


# Placement colours: resident before the first step, allocated in forward, in backward.
_PHASES = (("resident", "0.6"), ("forward", "C0"), ("backward", "C1"))


def require_placements(plan: Plan) -> None:
    """MemplanError unless the plan holds its allocations' layout."""
    if not plan.placements:
        raise MemplanError(
            f"plan {plan.name!r} has no placements: its file predates memplan's layouts; "
            "plan again to lay out its allocations"
        )


def placement_plot(plan: Plan, path: str | Path) -> None:
    """Write placement_figure(plan) as a PNG."""
    figure = placement_figure(plan)
    write_atomically(path, lambda out: figure.savefig(out, format="png", dpi=120), binary=True)


def placement_figure(plan: Plan) -> Figure:
    """Where each allocation lies in the plan's arena: step on the x axis, address on the
    y axis, one rectangle per allocation, coloured by when it was made (resident before
    the first step, in the forward pass, in the backward pass).

    The rectangle of an allocation live after steps start..end-1 spans x = start..end, so
    that the column over step i holds what is live after step i (the column over -1: what
    is resident before the first step) and stacks up to the timeline's bytes there. Lines
    mark the arena, the predicted live peak (the least arena any layout can have), the
    budget and where the backward pass starts.
    """
    require_placements(plan)
    figure = Figure(figsize=(10, 5), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()

    placed = np.array(plan.placements, dtype=np.int64).reshape(-1, 4)
    placed = placed[(placed[:, 1] > placed[:, 0]) & (placed[:, 2] > 0)]
    start, end = placed[:, 0].astype(float), placed[:, 1].astype(float)
    low = placed[:, 3] / MIB
    high = (placed[:, 3] + placed[:, 2]) / MIB
    # One polygon per allocation, in one collection: thousands draw in well under a second.
    corners = np.stack(
        [
            np.stack(corner, axis=1)
            for corner in ((start, low), (end, low), (end, high), (start, high))
        ],
        axis=1,
    )
    phase = np.where(placed[:, 0] < 0, 0, np.where(placed[:, 0] < plan.backward_start, 1, 2))
    faces = to_rgba_array([color for _, color in _PHASES])[phase]
    # Edges a darker shade of each face: neighbours stay apart, and a sliver of a few KiB
    # keeps its colour where a white edge would wash it out.
    edges = faces * [0.6, 0.6, 0.6, 1.0]
    axes.add_collection(PolyCollection(corners, facecolors=faces, edgecolors=edges, linewidths=0.4))
    handles: list[object] = [
        Patch(color=color, label=f"{name} ({int((phase == index).sum())})")
        for index, (name, color) in enumerate(_PHASES)
        if (phase == index).any()
    ]

    for height, color, style, what in (
        (plan.arena, "black", "--", "arena"),
        (plan.predicted_peak, "C2", "--", "predicted live peak"),
        (plan.budget, "C3", "-.", "budget"),
    ):
        handles.append(
            axes.axhline(
                height / MIB,
                color=color,
                linestyle=style,
                linewidth=1,
                label=f"{what} {format_bytes(height)}",
            )
        )
    steps = max(len(plan.timeline), int(placed[:, 1].max()) if len(placed) else 0)
    if 0 < plan.backward_start <= steps:
        handles.append(
            axes.axvline(
                plan.backward_start,
                color="black",
                linestyle=":",
                linewidth=1,
                label="backward starts",
            )
        )

    axes.set_xlim(-1, max(steps, 1))
    top = max(plan.arena, plan.budget, plan.predicted_peak, 1)
    axes.set_ylim(0, top / MIB * 1.04)
    axes.set_xlabel("step (each column: what is live after it; -1: before the first)")
    axes.set_ylabel("address in the arena (MiB)")
    method = f", {plan.layout_method} layout" if plan.layout_method else ""
    axes.set_title(
        f"placements: {plan.name}: arena {format_bytes(plan.arena)}{method}, "
        f"fragmentation {plan.fragmentation:.2%} above the live peak"
    )
    axes.grid(alpha=0.3)
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    return figure


def _has_clock(clock: Sequence[float], timeline: Sequence[int]) -> bool:
    return len(clock) == len(timeline) and any(clock)


def _xs(clock: Sequence[float], steps: int, use_clock: bool) -> list[float]:
    """x of each step's end: milliseconds of predicted compute, or the step number."""
    if use_clock:
        return [t * 1e3 for t in clock]
    return [float(i + 1) for i in range(steps)]
