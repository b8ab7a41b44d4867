"""The layout benchmark (benchmarks/layout.py) on one tiny case: a small CNN and the
smallest shared graph at one budget, written to a temporary folder; and its verdicts on
hand-made rows."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from benchmarks import layout
from benchmarks.layout import Row, mode_verdict, verdicts
from benchmarks.models import SIZES

SMALL_CNN = {"batch": 2, "image": 8, "channels": 4, "blocks": 1}
SMALL_GRAPH = "checkmate_vgg16_b256_224x224_train"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    images = tmp_path_factory.mktemp("img")
    found = layout.run(
        ["cnn"],
        layout.graph_paths([SMALL_GRAPH]),
        ["0.8"],
        layout.METHODS,
        5.0,
        sizes={"cnn": SMALL_CNN},
        plot=("cnn", "size"),
        image_dir=images,
    )
    found["images"] = images
    return found


def test_every_arena_is_at_least_its_live_peak(data):
    rows = [Row(**r) for r in data["rows"]]
    kinds = {(r.kind, r.mode, r.method) for r in rows}
    expected = {(k, m, x) for k in ("model", "graph") for m in layout.MODES for x in layout.METHODS}
    assert kinds == expected
    laid = [r for r in rows if r.arena is not None]
    assert laid, "no case was laid out"
    for r in laid:
        assert r.live_peak is not None and r.aligned_peak is not None
        assert r.arena >= r.aligned_peak >= r.live_peak, r
        assert r.fragmentation is not None and r.fragmentation >= 0
        assert r.arena_fits == (r.arena <= r.budget)
        # the layout's own status (Layout.status, the plan's layout_status for zoo rows)
        assert r.layout_status in {"optimal", "feasible", "heuristic"}, r
        if r.layout != "exact":  # a heuristic is optimal exactly when it meets the bound
            assert (r.layout_status == "optimal") == (r.arena == r.aligned_peak), r
    # Without fragmentation-aware planning, every zoo row has a plan (best effort at worst).
    assert all(r.arena is not None for r in rows if r.kind == "model" and r.mode == "live")
    # Arena mode either lays out within the budget or records why not.
    for r in rows:
        if r.kind == "model" and r.mode == "arena":
            assert r.arena_fits or (r.outcome == "infeasible" and r.least is not None), r


def test_the_json_and_the_page_are_written(data, tmp_path):
    figures, page = tmp_path / "layout.json", tmp_path / "layout.md"
    layout.write_outputs({k: v for k, v in data.items() if k != "images"}, figures, page)
    saved = json.loads(figures.read_text())
    assert saved["machine"]["cpu_cores"] and saved["wall_seconds"] > 0
    assert saved["sizes"] == {"cnn": SMALL_CNN}
    assert len(saved["rows"]) == len(data["rows"])
    text = page.read_text()
    assert "Do not edit by hand" in text
    assert "## Zoo models" in text and "## Shared graphs" in text
    assert "| cnn | 0.8 " in text and f"| {SMALL_GRAPH} |" in text
    assert "- cnn, live mode: " in text and "- cnn, arena mode: " in text
    assert "at these sizes: cnn batch 2, image 8, channels 4, blocks 1." in text
    assert "cp-sat" not in text
    # The placement plot was drawn where it was asked for, and the page links it.
    assert (data["images"] / "layout_cnn.png").stat().st_size > 0
    assert "![cnn: placements](img/layout_cnn.png)" in text
    # The page is a function of the JSON alone.
    assert layout.markdown(saved) == text


def test_the_zoo_models_are_built_at_the_head_to_head_sizes(monkeypatch):
    built = {}

    class Traced(Exception):
        pass

    def trace_model(name, **size):
        built[name] = size
        raise Traced  # no need to trace: only the sizes are checked

    monkeypatch.setattr(layout, "trace_model", trace_model)
    with pytest.raises(Traced):
        layout.run(["resnet50"], [], ["0.8"], ["size"], 1.0, plot=None)
    assert built == {"resnet50": SIZES["resnet50"]}
    # The page says so, sizes listed.
    listed = ", ".join(f"{k} {v}" for k, v in SIZES["resnet50"].items())
    data = {
        "machine": layout.machine(),
        "time_limit": 1.0,
        "wall_seconds": 1.0,
        "sizes": {"resnet50": SIZES["resnet50"]},
        "rows": [],
    }
    assert (
        "Zoo models (`memplan.tools.zoo`) at the sizes of the head-to-head benchmark "
        f"([results](results.md), `benchmarks.models.SIZES`): resnet50 {listed}. Each is "
    ) in layout.markdown(data)


def row(method: str, share: str, live: int, arena: int | None, mode: str = "live") -> Row:
    return Row(
        kind="model",
        case="m",
        share=share,
        mode=mode,
        method=method,
        budget=1000,
        outcome="planned" if arena is not None else "infeasible",
        live_peak=live,
        aligned_peak=live,
        arena=arena,
    )


def test_a_miss_is_flagged_with_how_much_it_misses_by():
    rows = [
        row("size", "0.9", 1000, 1030),
        row("size", "0.8", 1000, 1070),  # 7%: size's worst
        row("start", "0.9", 1000, 1060),  # 6%: start's worst, the best method's
        row("start", "0.8", 1000, 1040),
    ]
    met, text = mode_verdict(rows)
    assert met is False
    assert text.startswith("missed by 1.00 points: `start` at most 6.00%")
    assert "`size` 7.00% (at 0.8, 2.00 over)" in text
    # Within the target at every budget by one method: met, whatever the others do.
    met, text = mode_verdict(
        [*rows, row("best", "0.9", 1000, 1050), row("best", "0.8", 1000, 1000)]
    )
    assert met is True and text.startswith("met: `best` at most 5.00%")


def test_verdicts_per_model_and_mode():
    rows = [
        row("size", "0.9", 900, 909),  # 1%, within the budget of 1000 B
        replace(row("size", "0.9", 1000, None, mode="arena"), least=1200, least_of="arena"),
        replace(row("size", "0.9", 1000, 1100), case="other"),
    ]
    lines = verdicts(rows)
    assert lines[0] == "- **live mode**: not met on every model: met on 1 of 2; missed on other."
    assert lines[1] == (
        "- **arena mode**: not met on every model: met on 0 of 1; no plan to judge on m."
    )
    assert "- m, arena mode: no plan at any budget (infeasible: the least arena found is " in (
        "\n".join(lines)
    )
    assert any(line.startswith("- other, live mode: missed by 5.00 points") for line in lines)
    # The live-mode plans whose arena is above their budget of 1000 B: other's, 1100 B.
    assert any("1 of 2 plans within their budget have an arena above it" in x for x in lines)
