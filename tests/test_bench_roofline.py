"""The roofline benchmark (benchmarks/roofline.py): op families, the summary statistics on
hand-made samples, and one real run on the MLP of the zoo, from trace to page and plot."""

from __future__ import annotations

import math
import operator

import pytest
import torch

from benchmarks import roofline
from benchmarks.roofline import FAMILIES, VIEW, WORK, Sample, by_family, family, summarise
from memplan.core import devices
from memplan.tools.zoo import ZOO

aten = torch.ops.aten


@pytest.fixture(scope="module")
def data():
    found = roofline.run(["mlp"], repeats=2)
    found["command"] = "python -m benchmarks.roofline --models mlp"
    return found


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (aten.mm.default, "matmul"),
        (aten.addmm.default, "matmul"),
        (aten.convolution_backward.default, "convolution"),
        (aten._scaled_dot_product_flash_attention_for_cpu_backward.default, "attention"),
        (aten.native_layer_norm_backward.default, "normalization"),
        (aten._native_batch_norm_legit_functional.default, "normalization"),
        (aten.gelu_backward.default, "pointwise"),
        (aten.clone.default, "copy"),  # tagged pointwise, but it only copies
        (aten.embedding_dense_backward.default, "copy"),
        (aten.sum.dim_IntList, "reduction"),
        (aten._log_softmax.default, "reduction"),
        (aten.t.default, VIEW),
        (aten._unsafe_view.default, VIEW),  # aliases its input, though not marked a view
        (operator.getitem, "other"),
    ],
)
def test_ops_fall_into_their_family(target, expected):
    assert family(target) == expected


def sample(ratio: float, nodes: int = 1, measured: float = 1e-4, name: str = "pointwise"):
    return Sample("m", "op", name, nodes, measured, measured * ratio)


def test_summary_weighs_nodes_and_leaves_noise_out_of_the_per_node_figures():
    noise = sample(100.0, measured=roofline.FLOOR / 2)
    s = summarise("x", [sample(2.0, nodes=3), sample(0.5), noise])
    assert s.nodes == 5 and s.floored == 1
    assert s.measured == pytest.approx(4e-4 + roofline.FLOOR / 2)
    assert s.roofline == pytest.approx(6e-4 + 0.5e-4 + 50 * roofline.FLOOR)
    assert s.ratio == pytest.approx(s.roofline / s.measured)
    # Three of the four timed nodes are at 2, one at 0.5: the median is 2, and the lower
    # quartile is interpolated 3/4 of the way from 0.5 to 2 on a log scale.
    assert s.median == pytest.approx(2.0)
    assert s.q25 == pytest.approx(math.sqrt(2))
    assert s.q75 == pytest.approx(2.0)
    assert s.under == pytest.approx(1 / 4)


def test_every_node_of_the_mlp_is_in_a_sample_of_a_known_family(data):
    joint = roofline.joint_graph(ZOO["mlp"]())
    calls = [n for n in joint.graph.nodes if n.op == "call_function"]
    samples = [Sample(**s) for s in data["samples"]]
    # Every call that returns a tensor (all but getitem here) is measured and estimated.
    assert sum(s.nodes for s in samples) == sum(n.target is not operator.getitem for n in calls)
    assert {s.family for s in samples} <= set(FAMILIES) - {"other"}
    assert {"matmul", "pointwise", "reduction", VIEW} <= {s.family for s in samples}
    assert data["uncounted"] == [] and [r["unrunnable"] for r in data["models"]] == [0]


def test_times_and_ratios_are_finite_and_positive(data):
    samples = [Sample(**s) for s in data["samples"]]
    for s in samples:
        assert 0 < s.measured < math.inf, s
        # The roofline never estimates below the launch overhead.
        assert devices.CPU.launch_overhead <= s.roofline < math.inf, s
    for row in data["families"]:
        for key in ("ratio", "median", "q25", "q75"):
            assert 0 < row[key] < math.inf, row
        assert 0 <= row["under"] <= 1
    assert data["models"][0]["eager_step"] > 0


def test_family_totals_add_up_to_the_nodes(data):
    samples = [Sample(**s) for s in data["samples"]]
    rows = {r["name"]: r for r in data["families"]}
    assert [r.name for r in by_family(samples)] == list(rows)
    families = [r for name, r in rows.items() if name != WORK]
    totals = {
        "nodes": sum(s.nodes for s in samples),
        "measured": sum(s.nodes * s.measured for s in samples),
        "roofline": sum(s.nodes * s.roofline for s in samples),
    }
    for key, total in totals.items():
        assert sum(r[key] for r in families) == pytest.approx(total)
        work = sum(r[key] for r in families if r["name"] != VIEW)
        assert rows[WORK][key] == pytest.approx(work)


def test_page_and_plot_show_every_family(data, tmp_path):
    image = tmp_path / "roofline.png"
    roofline.plot(data, image)
    assert image.read_bytes().startswith(b"\x89PNG")
    page = roofline.markdown(data, "roofline.png")
    assert data["command"] in page and data["machine"]["cpu"] in page
    for row in data["families"]:
        assert f"| {row['name']} | {row['nodes']} |" in page
    assert "| mlp | " in page and "![roofline against measured times](roofline.png)" in page
