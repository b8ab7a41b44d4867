"""Reports of a plan's layout: the arena and fragmentation rows of the summary table and
the placement plot."""

from __future__ import annotations

import dataclasses
import io

import pytest
from matplotlib.collections import PolyCollection
from matplotlib.colors import to_rgba
from rich.console import Console

from memplan.core.errors import MemplanError
from memplan.planner.plan_file import Plan
from memplan.tools.report import MIB, placement_figure, placement_plot, summary_table

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def laid_out_plan() -> Plan:
    """Five steps, backward from step 3: a resident parameter, a forward activation and a
    backward gradient placed 12 B above where it could go, so the arena is 3012 B against
    a live peak of 3000 B; one allocation of no bytes, which takes no room. The least arena
    (arena_bound) is set by hand to 3006 B, as if rounding had added 6 B to the peak."""
    return Plan(
        name="tiny",
        solver="greedy",
        status="feasible",
        device="cpu",
        budget=3100,
        unplanned_peak=3500,
        predicted_peak=3000,
        unplanned_time=4.0,
        predicted_time=4.5,
        solve_seconds=0.25,
        fingerprint="abc123",
        decisions={"act": "keep"},
        tensor_bytes={"act": 2000},
        timeline=[3000, 3000, 3000, 2500, 2500],
        clock=[1.0, 2.0, 3.0, 4.0, 4.5],
        unplanned_timeline=[3500, 3500, 3500, 3000, 3000],
        unplanned_clock=[1.0, 2.0, 3.0, 4.0, 4.0],
        backward_start=3,
        arena=3012,
        arena_bound=3006,
        layout_method="size",
        layout_status="heuristic",
        placements=[[-1, 5, 1000, 0], [0, 3, 2000, 1000], [3, 5, 1500, 1512], [1, 2, 0, 0]],
    )


def older_plan() -> Plan:
    """The same plan as a file written before layouts holds it: no arena, no placements."""
    return dataclasses.replace(
        laid_out_plan(),
        arena=0,
        arena_bound=0,
        layout_method="",
        layout_status="",
        placements=[],
    )


def rows(plan: Plan) -> dict[str, str]:
    """summary_table(plan) as printed: each row's label to its value."""
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(summary_table(plan))
    found = {}
    for line in out.getvalue().splitlines():
        cells = [cell.strip() for cell in line.strip("│ ").split("│")]
        if len(cells) == 2:
            found[cells[0]] = cells[1]
    return found


def test_summary_shows_the_arena_its_layout_and_the_fragmentation():
    shown = rows(laid_out_plan())
    assert shown["arena"] == "2.94 KiB (size layout, heuristic)"
    # 3012 / 3000 - 1, of which 3006 / 3000 - 1 is the rounding no layout avoids
    assert shown["fragmentation"] == (
        "0.40% above the predicted peak (512-byte rounding alone: 0.20%)"
    )
    assert list(shown).index("arena") == list(shown).index("predicted peak") + 1
    assert list(shown).index("fragmentation") == list(shown).index("arena") + 1


def test_summary_shows_an_optimal_layout_at_its_bound():
    plan = dataclasses.replace(laid_out_plan(), arena_bound=3012, layout_status="optimal")
    shown = rows(plan)
    assert shown["arena"] == "2.94 KiB (size layout, optimal)"
    # all of the fragmentation is rounding
    assert shown["fragmentation"] == (
        "0.40% above the predicted peak (512-byte rounding alone: 0.40%)"
    )


def test_summary_of_a_plan_without_a_layout_status_or_bound():
    # a plan file written before the status and the bound were recorded
    plan = dataclasses.replace(laid_out_plan(), arena_bound=0, layout_status="")
    shown = rows(plan)
    assert shown["arena"] == "2.94 KiB (size layout)"
    assert shown["fragmentation"] == "0.40% above the predicted peak"  # no rounding clause


def test_summary_says_when_the_arena_is_above_the_budget():
    shown = rows(dataclasses.replace(laid_out_plan(), budget=3005))
    assert shown["arena"] == "2.94 KiB (size layout, heuristic, above the budget)"
    shown = rows(dataclasses.replace(laid_out_plan(), budget=3005, layout_status=""))
    assert shown["arena"] == "2.94 KiB (size layout, above the budget)"


def test_summary_of_an_older_plan_has_no_arena_rows():
    shown = rows(older_plan())
    assert "predicted peak" in shown
    assert "arena" not in shown
    assert "fragmentation" not in shown


def test_placement_figure_draws_one_rectangle_per_allocation():
    plan = laid_out_plan()
    axes = placement_figure(plan).axes[0]
    (rectangles,) = [c for c in axes.collections if isinstance(c, PolyCollection)]
    corners = [path.vertices[:4].tolist() for path in rectangles.get_paths()]
    assert len(corners) == 3  # the allocation of no bytes is not drawn
    # x: the steps the allocation is live after (-1: before the first); y: its addresses.
    assert corners[0] == [[-1, 0], [5, 0], [5, 1000 / MIB], [-1, 1000 / MIB]]
    assert corners[2] == [[3, 1512 / MIB], [5, 1512 / MIB], [5, 3012 / MIB], [3, 3012 / MIB]]
    resident, forward, backward = (tuple(c) for c in rectangles.get_facecolors())
    assert len({resident, forward, backward}) == 3  # coloured by when each was allocated
    assert forward == to_rgba("C0")
    # edges a darker shade of each face, so that a sliver of a few bytes keeps its colour
    faces, edges = rectangles.get_facecolors(), rectangles.get_edgecolors()
    assert edges[:, :3] == pytest.approx(0.6 * faces[:, :3])
    lines = {line.get_label(): line for line in axes.get_lines()}
    assert lines["arena 2.94 KiB"].get_ydata()[0] == 3012 / MIB
    assert lines["predicted live peak 2.93 KiB"].get_ydata()[0] == 3000 / MIB
    assert lines["budget 3.03 KiB"].get_ydata()[0] == 3100 / MIB
    assert lines["backward starts"].get_xdata()[0] == 3
    assert axes.get_ylim()[1] >= 3100 / MIB  # the budget, the highest line, is in view
    title = axes.get_title()
    assert "tiny" in title and "2.94 KiB" in title and "size layout" in title
    assert "fragmentation 0.40%" in title
    legend = [text.get_text() for text in axes.get_legend().get_texts()]
    assert legend[:3] == ["resident (1)", "forward (1)", "backward (1)"]


def test_placement_plot_writes_a_png(tmp_path):
    path = tmp_path / "placements.png"
    placement_plot(laid_out_plan(), path)
    assert path.read_bytes().startswith(PNG_MAGIC)
    assert [p.name for p in tmp_path.iterdir()] == ["placements.png"]


def test_placement_plot_of_many_allocations(tmp_path):
    """5000 allocations draw as one collection (one patch each would take seconds)."""
    plan = laid_out_plan()
    placements = [[i, i + 3, 1024, (i % 7) * 1024] for i in range(5000)]
    big = dataclasses.replace(
        plan, placements=placements, timeline=[3 * 1024] * 5003, arena=7 * 1024
    )
    axes = placement_figure(big).axes[0]
    (rectangles,) = [c for c in axes.collections if isinstance(c, PolyCollection)]
    assert len(rectangles.get_paths()) == 5000
    assert [path.vertices[0].tolist() for path in rectangles.get_paths()[:2]] == [
        [0, 0],
        [1, 1024 / MIB],
    ]
    path = tmp_path / "big.png"
    placement_plot(big, path)
    assert path.read_bytes().startswith(PNG_MAGIC)


def test_placement_plot_of_an_older_plan_says_to_plan_again(tmp_path):
    path = tmp_path / "placements.png"
    with pytest.raises(MemplanError, match="predates memplan's layouts; plan again"):
        placement_plot(older_plan(), path)
    assert not path.exists()
