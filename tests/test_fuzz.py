"""Fuzzing the CLI and the API with bad inputs: budgets, graph files, .pt2 and plan files.

Each bad input must end as one `memplan: error:` line and exit status 2 from the CLI, with
no output file written, and as a MemplanError subclass from the API; a timed-out exact
solver must return a schedule within the budget and say which one it is.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import os
import re
import stat
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import memplan
from memplan.cli import args as cli_args
from memplan.cli import main as cli_module
from memplan.cli.main import main
from memplan.core import remat
from memplan.core.budget import Budget
from memplan.core.errors import (
    BudgetError,
    GraphError,
    InfeasibleBudget,
    MemplanError,
    ModelFileError,
    PlanFileError,
)
from memplan.core.files import write_json_atomically, write_together
from memplan.core.graph import Compute, Graph, Node, Schedule, SolveResult
from memplan.core.node_link import load_node_link
from memplan.core.simulate import simulate
from memplan.planner import solve as solve_module
from memplan.planner.model_file import load_model
from memplan.planner.plan_file import Plan
from memplan.planner.solve import Solved, provenance, solve_within_budget
from memplan.solvers import SolverOptions

REPO = Path(__file__).resolve().parents[1]
GRAPHS = REPO / "benchmarks" / "graphs"
VGG = GRAPHS / "checkmate_vgg16_b256_224x224_train.json"  # 45 nodes, ids ascending
LAYERED = GRAPHS / "random_layered_n100.json"  # 100 nodes, ids in 'name', graph.order
FUZZ = settings(max_examples=40, deadline=None)
FEW = settings(max_examples=25, deadline=None)
INFEASIBLE = re.compile(r"budget .*?\((\d+) B\) is below the smallest feasible peak .*?\((\d+) B\)")


# --- running the CLI -------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    code: int
    out: str
    err: str


def run_cli(argv: list[str]) -> Run:
    """main(argv) with its stdout and stderr captured (hypothesis examples cannot share
    the function-scoped capsys)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return Run(code, out.getvalue(), err.getvalue())


def expect_error(argv: list[str], output: Path) -> str:
    """Run argv; expect exit 2, one `memplan: error:` line on stderr and nothing at
    `output` nor at its folder (which the tests name fresh); return that line."""
    run = run_cli(argv)
    assert run.code == 2, run
    assert run.err.startswith("memplan: error: "), run.err
    assert run.err.count("\n") == 1, run.err
    assert "Traceback" not in run.err
    assert not output.exists()
    assert not output.parent.exists(), sorted(output.parent.iterdir())
    return run.err


def expect_error_or_schedule(argv: list[str], output: Path) -> Run:
    """A solve of a damaged file either fails as expect_error does or writes a complete
    schedule within its budget."""
    run = run_cli(argv)
    if run.code == 0:
        report = json.loads(output.read_text())
        assert report["peak"] <= report["budget"]
        assert sorted(p.name for p in output.parent.iterdir()) == [output.name]
    else:
        assert run.code == 2, run
        assert run.err.startswith("memplan: error: ") and run.err.count("\n") == 1, run.err
        assert not output.parent.exists()
    return run


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="memplan-fuzz-") as name:
        yield Path(name)


def solve_argv(graph: Path, budget: str, output: Path, *extra: str) -> list[str]:
    # --budget=VALUE: argparse would read a value that starts with '-' as an option
    return ["solve", str(graph), f"--budget={budget}", "--solver", "director", *extra,
            "-o", str(output)]  # fmt: skip


# --- budgets ---------------------------------------------------------------------------

NAMED_BAD_BUDGETS = [
    "0", "0.0", "-0", "-1", "-0.5", "-5GB", "0%", "0GiB", "nan", "NaN", "inf", "-inf",
    "Infinity", "nan%", "", " ", "abc", "5 parsecs", "1/0", "3/4", "0x10", "1_000", "½", "٣",
    "1e400", "1e999999999", "1e-999999999 GB", "1e-999999999%", "2**8", "None", "True",
    "[1]", "1e18 GB", "9223372036854775808",
]  # fmt: skip
BAD_BUDGET_TEXTS = st.one_of(
    st.sampled_from(NAMED_BAD_BUDGETS),
    st.floats(max_value=0).map(repr),  # 0.0, -0.0, negatives, -inf
    st.integers(max_value=0).map(str),
    st.integers(min_value=2**63).map(str),  # more bytes than a budget may name
    st.text(  # no ASCII digit: never a number
        alphabet=st.characters(blacklist_characters="0123456789", blacklist_categories=["Cs"]),
        max_size=12,
    ),
)

BAD_BUDGET_VALUES = st.one_of(
    BAD_BUDGET_TEXTS,
    st.floats(max_value=0),
    # 1e-19 of a peak: under 1 byte of any peak a device could have
    st.sampled_from([math.nan, math.inf, -math.inf, 1e-300, 1e-19]),
    st.integers(max_value=0),
    st.integers(min_value=2**63),
    st.sampled_from([None, True, False, [1], b"1GB", {"bytes": 1}]),
)


class Tiny(nn.Module):
    """Linear, Tanh, Linear on a batch of 4: plans in a fraction of a second."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x).square().mean()


def _tiny() -> tuple[Tiny, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Tiny(), (torch.randn(4, 8),)


@pytest.fixture(scope="module")
def vgg() -> Any:
    return load_node_link(VGG)


@FUZZ
@given(budget=BAD_BUDGET_TEXTS)
def test_bad_budgets_fail_in_one_line_from_solve(vgg, budget):
    with pytest.raises(BudgetError):
        remat.resolve_budget(vgg, budget)
    with workdir() as tmp:
        output = tmp / "out" / "schedule.json"
        assert "budget" in expect_error(solve_argv(VGG, budget, output), output)


@FUZZ
@given(budget=BAD_BUDGET_VALUES)
def test_bad_budgets_raise_budget_error_from_the_api(budget):
    model, inputs = _tiny()
    with pytest.raises(BudgetError):  # before anything is traced
        memplan.plan(model, inputs, budget=budget, measure=False)
    with pytest.raises(BudgetError):
        Budget.parse(budget)


@FEW
@given(budget=BAD_BUDGET_TEXTS)
def test_bad_budgets_fail_in_one_line_from_plan(pt2, budget):
    with workdir() as tmp:
        output = tmp / "out" / "plan.json"
        argv = ["plan", str(pt2), f"--budget={budget}", "--no-measure", "-o", str(output)]
        assert "budget" in expect_error(argv, output)


BELOW_LEAST = st.one_of(
    # The director's least peak on VGG16 is 13153337344 B, 0.83 of the reference peak.
    st.floats(min_value=1e-12, max_value=0.8).map(repr),
    st.integers(min_value=2, max_value=12 * 10**9).map(str),  # "1" is a share: all of it
    st.sampled_from(["1e-9", "1 B", "1GiB", "50%"]),  # 1e-30 is no budget: under 1 byte
)


# Each example solves VGG16 twice (about a second each): fewer examples than FUZZ.
@settings(max_examples=12, deadline=None)
@given(budget=BELOW_LEAST)
def test_budgets_below_the_least_feasible_name_it(vgg, budget):
    bytes_ = remat.resolve_budget(vgg, budget)
    with pytest.raises(InfeasibleBudget) as raised:
        solve_within_budget(vgg, bytes_, "director", SolverOptions(time_limit=5, problem="general"))
    assert raised.value.budget == bytes_ < raised.value.smallest_feasible
    with workdir() as tmp:
        output = tmp / "out" / "schedule.json"
        message = expect_error(solve_argv(VGG, budget, output), output)
    found = INFEASIBLE.search(message)
    assert found is not None, message
    assert int(found.group(1)) == bytes_ < int(found.group(2))


@settings(max_examples=3, deadline=None)
@given(budget=st.integers(min_value=2, max_value=1000))  # 1 is a share: all of the peak
def test_the_api_names_the_least_feasible_budget(budget):
    model, inputs = _tiny()
    with pytest.raises(InfeasibleBudget) as raised:
        memplan.plan(model, inputs, budget=budget, measure=False)
    assert raised.value.budget == budget < raised.value.smallest_feasible
    assert "\n" not in str(raised.value)


def test_a_budget_the_named_solver_misses_gets_the_directors_schedule(vgg, tmp_path):
    """keep_all peaks over 0.9 of the reference; the director meets it. The error used to
    name a 'smallest feasible peak' under the budget it called infeasible."""
    output = tmp_path / "schedule.json"
    run = run_cli(["solve", str(VGG), "--budget", "0.9", "--solver", "keep_all", "-o", str(output)])
    assert run.code == 0, run
    report = json.loads(output.read_text())
    assert report["solver"] == "director" and report["peak"] <= report["budget"]
    assert "keep_all found no schedule within the budget" in report["note"]
    assert report["note"] in " ".join(run.out.split())


# --- graph files -----------------------------------------------------------------------


@dataclass(frozen=True)
class Dialect:
    """A node-link dialect, with the fields a graph cannot do without."""

    path: Path
    id_field: str
    size_field: str
    time_field: str
    ends: tuple[str, str]

    def data(self) -> dict[str, Any]:
        return json.loads(self.path.read_text())

    def link(self, source: object, target: object) -> dict[str, object]:
        return {self.ends[0]: source, self.ends[1]: target}


CHECKMATE = Dialect(VGG, "id", "cost_ram", "cost_cpu", ("source", "target"))
RANDOM_LAYERED = Dialect(LAYERED, "name", "out_cost", "duration", ("0", "1"))
DIALECTS = {"checkmate": CHECKMATE, "layered": RANDOM_LAYERED}
ORIGINALS = {name: dialect.data() for name, dialect in DIALECTS.items()}

JUNK = st.one_of(
    st.text(max_size=4),
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
)
NOT_AN_ID = st.one_of(JUNK, st.booleans(), st.floats())  # a float is never a JSON integer
NOT_BYTES = st.one_of(
    JUNK,
    st.booleans(),
    st.integers(max_value=-1),
    st.integers(min_value=2**63),
    st.floats(max_value=-1e-9),
    st.sampled_from([math.nan, math.inf, 0.5, 1.25, 1e30]),
)
NOT_A_TIME = st.one_of(
    JUNK,
    st.booleans(),
    st.integers(max_value=-1),
    st.integers(min_value=2**1024),  # too large for a float
    st.floats(max_value=-1e-9),
    st.sampled_from([math.nan, math.inf]),
)
NOT_A_FLAG = st.one_of(JUNK.filter(lambda v: v is not None), st.integers(), st.just("false"))
DAMAGE = [
    "drop a node field",
    "drop a link end",
    "drop nodes or links",
    "cycle",
    "self loop",
    "unknown id",
    "truncate",
    "wrong type",
    "repeated id",
    "no nodes",
    "bad order",
    "not utf-8",
    "nested",
    "not an object",
    "too large",
]


@st.composite
def damaged_graphs(draw: st.DrawFn) -> tuple[str, bytes]:
    """(what was done, file bytes) of a real graph damaged so that it cannot load."""
    dialect_name = draw(st.sampled_from(sorted(DIALECTS)))
    dialect = DIALECTS[dialect_name]
    data = copy.deepcopy(ORIGINALS[dialect_name])
    nodes, links = data["nodes"], data["links"]
    ids = {node[dialect.id_field] for node in nodes}
    damage = draw(st.sampled_from(DAMAGE))
    node = draw(st.sampled_from(nodes))
    link = draw(st.sampled_from(links))
    if damage == "drop a node field":
        field = draw(st.sampled_from([dialect.id_field, dialect.size_field, dialect.time_field]))
        del node[field]
    elif damage == "drop a link end":
        del link[draw(st.sampled_from(dialect.ends))]
    elif damage == "drop nodes or links":
        key = draw(st.sampled_from(["nodes", "links"]))
        if draw(st.booleans()):
            del data[key]
        else:
            data[key] = draw(JUNK.filter(lambda v: not isinstance(v, list)))
    elif damage == "cycle":
        links.append(dialect.link(link[dialect.ends[1]], link[dialect.ends[0]]))
    elif damage == "self loop":
        links.append(dialect.link(node[dialect.id_field], node[dialect.id_field]))
    elif damage == "unknown id":
        end = draw(st.sampled_from(dialect.ends))
        link[end] = draw(st.integers().filter(lambda v: v not in ids))
    elif damage == "truncate":
        text = json.dumps(data, separators=(",", ":"))
        return damage, text[: draw(st.integers(0, len(text) - 1))].encode()
    elif damage == "wrong type":
        field, values = draw(
            st.sampled_from(
                [
                    (dialect.id_field, NOT_AN_ID),
                    (dialect.size_field, NOT_BYTES),
                    (dialect.time_field, NOT_A_TIME),
                    ("backward", NOT_A_FLAG),
                    (dialect.ends[0], NOT_AN_ID),
                    (dialect.ends[1], NOT_AN_ID),
                ]
            )
        )
        (link if field in dialect.ends else node)[field] = draw(values)
    elif damage == "repeated id":
        nodes.append(dict(node))
    elif damage == "no nodes":
        data["nodes"], data["links"] = [], []
    elif damage == "bad order":
        order = list(range(len(nodes))) if dialect is CHECKMATE else data["graph"]["order"]
        data.setdefault("graph", {})["order"] = draw(
            st.sampled_from(
                [
                    order[::-1],  # not topological
                    order[1:],  # a node missing
                    [*order, order[0]],  # a node twice
                    [*order[:-1], max(ids) + 1],  # an unknown node
                    [str(v) for v in order],
                    "0 1 2",
                ]
            )
        )
    elif damage == "not utf-8":
        text = json.dumps(data).encode()
        at = draw(st.integers(0, len(text) - 1))
        return damage, text[:at] + b"\xff\xfe" + text[at:]
    elif damage == "nested":
        return damage, b"[" * draw(st.integers(10**4, 10**5))
    elif damage == "not an object":
        return damage, json.dumps(draw(st.one_of(st.lists(st.integers()), st.integers(),
                                                 st.text(), st.none()))).encode()  # fmt: skip
    elif damage == "too large":
        total = draw(st.sampled_from(["bytes", "times"]))
        for each in nodes:
            if total == "bytes":
                each[dialect.size_field] = 2**63 // len(nodes) + 1
            else:
                each[dialect.time_field] = 1.7e308 / len(nodes)
    return damage, json.dumps(data).encode()


@FUZZ
@given(case=damaged_graphs())
def test_damaged_graph_files_fail_in_one_line(case):
    _, content = case
    with workdir() as tmp:
        graph = tmp / "graph.json"
        graph.write_bytes(content)
        with pytest.raises(GraphError):
            load_node_link(graph)
        output = tmp / "out" / "schedule.json"
        expect_error(solve_argv(graph, "0.9", output), output)
        assert graph.read_bytes() == content


@FUZZ
@given(
    dialect=st.sampled_from(sorted(DIALECTS)),
    flips=st.lists(
        st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)), min_size=1, max_size=4
    ),
)
def test_randomly_corrupted_graph_files_load_or_fail_in_one_line(dialect, flips):
    content = bytearray(DIALECTS[dialect].path.read_bytes())
    for where, value in flips:
        content[int(where * len(content))] = value
    with workdir() as tmp:
        graph = tmp / "graph.json"
        graph.write_bytes(bytes(content))
        with contextlib.suppress(GraphError):
            load_node_link(graph)
        output = tmp / "out" / "schedule.json"
        expect_error_or_schedule(solve_argv(graph, "0.9", output), output)


def test_parsed_json_of_the_wrong_type_raises_graph_error():
    for value in ([1, 2], 42, None, b"{}"):
        with pytest.raises(GraphError):
            load_node_link(value)  # type: ignore[arg-type]


def checkmate_with_every(folder: Path, field: str, value: object) -> Path:
    """The checkmate-dialect graph with `field` set to `value` on every node, as a file."""
    data = copy.deepcopy(ORIGINALS["checkmate"])
    for node in data["nodes"]:
        node[field] = value
    graph = folder / f"every_{field}.json"
    graph.write_text(json.dumps(data))
    return graph


def test_a_graph_whose_nodes_take_no_time_solves(tmp_path):
    """The duration increase divided by the reference duration, 0 here."""
    graph = checkmate_with_every(tmp_path, "cost_cpu", 0)
    output = tmp_path / "schedule.json"
    run = run_cli(solve_argv(graph, "1.0", output))
    assert run.code == 0, run
    assert json.loads(output.read_text())["duration"] == 0
    assert "duration 0, as the reference order" in " ".join(run.out.split())


def test_a_share_of_a_graph_without_bytes_is_no_budget(tmp_path):
    graph = checkmate_with_every(tmp_path, "cost_ram", 0)
    with pytest.raises(BudgetError, match="reference peak of 0 bytes"):
        remat.resolve_budget(load_node_link(graph), "0.9")
    output = tmp_path / "out" / "schedule.json"
    assert "0 bytes" in expect_error(solve_argv(graph, "0.9", output), output)
    assert run_cli(solve_argv(graph, "1KiB", output)).code == 0  # bytes are a budget


# --- .pt2 files ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pt2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "tiny.pt2"
    model, inputs = _tiny()
    torch.export.save(torch.export.export(model, inputs), path)
    return path


def plan_argv(model: Path, output: Path) -> list[str]:
    return ["plan", str(model), "--budget", "100%", "--no-measure", "-o", str(output)]


@FEW
@given(data=st.data(), damage=st.sampled_from(["truncate", "random bytes", "flip bytes"]))
def test_corrupt_pt2_files_fail_in_one_line(pt2, data, damage):
    original = pt2.read_bytes()
    if damage == "truncate":
        content = original[: data.draw(st.integers(0, len(original) - 1))]
    elif damage == "random bytes":
        content = data.draw(st.binary(max_size=4096))
    else:
        flipped = bytearray(original)
        for _ in range(data.draw(st.integers(1, 4))):
            flipped[data.draw(st.integers(0, len(original) - 1))] ^= data.draw(st.integers(1, 255))
        content = bytes(flipped)
    with workdir() as tmp:
        model = tmp / "model.pt2"
        model.write_bytes(content)
        output = tmp / "out" / "plan.json"
        if damage == "flip bytes":  # a flip in a weight or a name can leave a loadable file
            with contextlib.suppress(ModelFileError):
                load_model(model)
            run = run_cli(plan_argv(model, output))
            assert run.code in (0, 2) and run.err.count("\n") == (run.code == 2), run
            assert output.exists() == (run.code == 0)
        else:
            with pytest.raises(ModelFileError):
                load_model(model)
            assert str(model) in expect_error(plan_argv(model, output), output)


def _rewrite(source: Path, target: Path, change: Any) -> None:
    """Copy the zip archive `source` to `target`, each member through change(name, bytes)
    (None drops it)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            content = change(info.filename, old.read(info))
            if content is not None:  # writestr updates the info it is given: give a copy
                new.writestr(copy.copy(info), content)


def test_corrupt_pt2_files_print_one_line_on_the_real_stderr(pt2, tmp_path):
    """torch.export.load logs a traceback as a warning before it raises, to a handler of
    its own on the real stderr, where capsys does not look: run the CLI in a subprocess.
    A ZIP64 locator naming several disks made zipfile raise BadZipFile, not OSError,
    past capture.load_exported's check."""
    original = pt2.read_bytes()
    files = {name: tmp_path / f"{name}.pt2" for name in
             ("renamed_op", "no_inputs", "multi_disk", "truncated")}  # fmt: skip
    _rewrite(pt2, files["renamed_op"],
             lambda name, b: b.replace(b"aten.tanh", b"aten.tanx") if name.endswith(".json")
             else b)  # fmt: skip
    _rewrite(pt2, files["no_inputs"], lambda name, b: None if "sample_inputs" in name else b)
    locator = original.rfind(b"PK\x06\x07")  # the ZIP64 end of central directory locator
    assert locator > 0
    multi_disk = bytearray(original)
    multi_disk[locator + 16] = 2  # "total number of disks"
    files["multi_disk"].write_bytes(bytes(multi_disk))
    files["truncated"].write_bytes(original[: len(original) // 2])
    output = tmp_path / "out" / "plan.json"
    script = (
        "import json, sys\n"
        "from memplan.cli.main import main\n"
        "out, *models = sys.argv[1:]\n"
        "codes = [main(['plan', m, '--budget', '100%', '--no-measure', '-o', out])"
        " for m in models]\n"
        "print(json.dumps(codes))\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", script, str(output), *map(str, files.values())],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.splitlines()[-1]) == [2] * len(files)
    lines = run.stderr.splitlines()
    assert len(lines) == len(files), run.stderr
    for line, path in zip(lines, files.values(), strict=True):
        assert line.startswith(f"memplan: error: {path}: "), line
    assert "aten.tanx" in lines[0]  # the cause torch logged, not "see the warnings above"
    assert "BadZipFile" in lines[2]
    assert not output.parent.exists()


# --- plan files ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan_json(pt2: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    assert run_cli(plan_argv(pt2, path)).code == 0
    return path


@FUZZ
@given(data=st.data())
def test_corrupt_plan_files_fail_in_one_line(plan_json, data):
    content = bytearray(plan_json.read_bytes())
    if data.draw(st.booleans()):
        content = content[: data.draw(st.integers(0, len(content) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 4))):
            content[data.draw(st.integers(0, len(content) - 1))] = data.draw(st.integers(0, 255))
    with workdir() as tmp:
        path = tmp / "plan.json"
        path.write_bytes(bytes(content))
        with contextlib.suppress(PlanFileError):
            Plan.load(path)
        png = tmp / "out" / "timeline.png"
        run = run_cli(["show", str(path), "--png", str(png)])
        assert run.code in (0, 2), run
        assert run.err.count("\n") == (run.code == 2) and "Traceback" not in run.err
        assert png.exists() == (run.code == 0)


def test_a_deeply_nested_plan_file_fails_in_one_line(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("[" * 100_000)
    png = tmp_path / "out" / "timeline.png"
    assert "nested too deeply" in expect_error(["show", str(path), "--png", str(png)], png)


def test_plan_load_raises_plan_file_error_on_deep_nesting(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text("[" * 100_000)
    with pytest.raises(PlanFileError):
        Plan.load(path)


# --- exact solvers at their time limit -------------------------------------------------


@pytest.mark.parametrize("seconds", ["0.5", "3"])
@pytest.mark.parametrize("solver", ["cpsat", "milp"])
def test_a_timed_out_exact_solver_says_which_schedule_it_returns(solver, seconds, tmp_path):
    """At 0.5 s the solvers return the director's start (or the director stands in); at
    3 s mostly their own schedule with its gap. Whichever, the note says which."""
    pytest.importorskip("ortools" if solver == "cpsat" else "pulp")
    output = tmp_path / "schedule.json"
    argv = ["solve", str(LAYERED), "--budget", "0.9", "--solver", solver,
            "--time-limit", seconds, "-o", str(output)]  # fmt: skip
    run = run_cli(argv)
    assert run.code == 0, run
    report = json.loads(output.read_text())
    graph = load_node_link(LAYERED)
    index = {source: i for i, source in enumerate(graph.source_ids)}
    # Scored on its own by the literature's rules, not by the solver's word.
    scored = remat.score(graph, [index[v] for v in report["sequence"]])
    assert scored.peak == report["peak"] <= report["budget"] == remat.resolve_budget(graph, "0.9")
    if report["status"] == "optimal":  # proved in time: nothing to say
        assert report["solver"] == solver and "note" not in report
        return
    note = report["note"]
    assert note in " ".join(run.out.split())  # the output says so as well
    if report["solver"] == "director":
        assert f"{solver} found no schedule within the budget" in note
    elif "the director's starting schedule" in note:
        assert report["solver"] == solver and "lower bound" in note
    else:
        assert report["solver"] == solver
        assert f"{solver} did not prove this schedule optimal within {seconds} s" in note
        assert (f"no lower bound from {solver}" in note) == ("gap" not in report)
        if "gap" in report:
            assert f"a gap of {report['gap']:.2%} to {solver}'s lower bound" in note


def _solved(note: str = "", **fields: Any) -> Solved:
    """A solve of a one-node graph with `fields` in its result and `note` from the driver."""
    graph = Graph(nodes=(Node(0, "a", "op", bytes=1),))
    schedule = Schedule(steps=(Compute(0),))
    result = SolveResult(**{"solver": "cpsat", "status": "feasible", "schedule": schedule,
                            **fields})  # fmt: skip
    return Solved(result, simulate(graph, schedule), 1, note)


@pytest.mark.parametrize(
    ("solved", "expected"),
    [
        (_solved(status="optimal"), None),
        (_solved("cpsat found none; director's", solver="director"), "director's"),
        (
            _solved(message="the director's starting schedule: cpsat found none", gap=0.25),
            "the director's starting schedule: cpsat found none; a gap of 25.00% to cpsat's",
        ),
        (
            _solved(gap=0.0154),
            "cpsat did not prove this schedule optimal within 2 s: it is the best cpsat found "
            "(feasible), with a gap of 1.54% to cpsat's lower bound",
        ),
        (_solved(gap=None), "(feasible), with no lower bound from cpsat"),
    ],
)
def test_provenance_says_which_schedule_a_solve_returns(solved, expected):
    note = provenance(solved, "cpsat", SolverOptions(time_limit=2))
    assert note is None if expected is None else expected in note
    heuristic = _solved(solver="director")
    assert provenance(heuristic, "director", SolverOptions()) is None


def test_a_best_effort_plan_reapplied_under_a_budget_that_holds_it_is_feasible(vgg):
    """A kept best-effort plan (memplan.backend(reuse=plan)) carried out under a budget
    its schedule meets is a plan for that budget, not a best effort; under one it misses,
    the search goes on as for any schedule."""
    everything = remat.to_schedule(vgg, range(len(vgg)))
    kept = SolveResult("director", "best-effort", everything)
    budget = remat.reference(vgg).peak
    general = SolverOptions(problem="general")
    solved = solve_within_budget(vgg, budget, "director", general, first=kept)
    assert solved.result.status == "feasible" and solved.result.schedule == everything
    lower = solve_within_budget(vgg, budget - 1, "director", general, first=kept, best_effort=True)
    assert lower.result.schedule != everything


def test_the_directors_least_memory_schedule_stands_in_where_its_search_missed(vgg, monkeypatch):
    """Where neither the named solver nor the director's budgeted search finds a schedule
    but the director's least-memory one fits, that is returned, and says so; it used to
    be an InfeasibleBudget naming a 'smallest feasible peak' under the budget."""
    everything = remat.to_schedule(vgg, range(len(vgg)))
    budget = remat.reference(vgg).peak

    def fake(name: str) -> Any:
        def solve(graph: Any, budget: int | None, options: SolverOptions) -> SolveResult:
            found = name == "director" and budget is None
            return SolveResult(name, "feasible" if found else "infeasible",
                               everything if found else None)  # fmt: skip

        return solve

    monkeypatch.setattr(solve_module, "get_solver", fake)
    general = SolverOptions(problem="general")
    for solver in ("cpsat", "director"):
        solved = solve_within_budget(vgg, budget, solver, general)
        assert solved.result.schedule == everything and solved.result.status == "feasible"
        note = provenance(solved, solver, general)
        assert note == (
            f"{solver} found no schedule within the budget (infeasible); "
            "this is the director's least-memory schedule"
        )
    with pytest.raises(InfeasibleBudget) as raised:
        solve_within_budget(vgg, budget - 1, "cpsat", general)
    assert (raised.value.smallest_feasible, raised.value.solver) == (budget, "director")


# --- output files ----------------------------------------------------------------------


def test_an_output_that_is_a_folder_fails_before_solving(tmp_path):
    folder = tmp_path / "taken"
    (folder / "inside").mkdir(parents=True)
    run = run_cli(solve_argv(VGG, "0.9", folder))
    assert run.code == 2 and run.err.count("\n") == 1 and "is a folder" in run.err
    assert sorted(p.name for p in folder.iterdir()) == ["inside"]


def test_an_output_under_a_file_fails_in_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    run = run_cli(solve_argv(VGG, "0.9", blocker / "schedule.json"))
    assert run.code == 2 and run.err.count("\n") == 1 and "not a folder" in run.err
    assert blocker.read_text() == "not a folder"


def test_an_output_that_is_the_input_fails_and_leaves_it(tmp_path):
    graph = tmp_path / "graph.json"
    graph.write_bytes(VGG.read_bytes())
    run = run_cli(solve_argv(graph, "0.9", graph))
    assert run.code == 2 and "would overwrite" in run.err
    assert graph.read_bytes() == VGG.read_bytes()


def test_a_failed_plot_leaves_no_plan_behind(pt2, tmp_path, monkeypatch):
    """`memplan plan -o plan.json --png t.png` wrote the plan, then failed on the plot."""

    def half_a_plot(plan: Plan, path: Path, **_: object) -> None:
        Path(path).write_bytes(b"\x89PNG half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli_args, "plot_timeline", half_a_plot)  # write_plan's plot
    output, png = tmp_path / "out" / "plan.json", tmp_path / "out" / "timeline.png"
    run = run_cli([*plan_argv(pt2, output), "--png", str(png)])
    assert run.code == 2 and run.err.count("\n") == 1, run
    assert "No space left on device" in run.err
    assert not output.parent.exists()  # nor any temporary file in it


def test_write_together_leaves_every_output_as_it_was_on_error(tmp_path):
    first, second = tmp_path / "first.json", tmp_path / "new" / "second.png"
    first.write_text("old")

    def fail(path: Path) -> None:
        path.write_text("partial")
        raise ValueError("broken writer")

    with pytest.raises(ValueError, match="broken writer"):
        write_together([(first, lambda path: path.write_text("new")), (second, fail)])
    assert first.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.json"]
    write_together([(first, lambda path: path.write_text("new")),
                    (second, lambda path: path.write_bytes(b"png"))])  # fmt: skip
    assert (first.read_text(), second.read_bytes()) == ("new", b"png")


def test_outputs_get_the_mode_of_any_new_file(tmp_path):
    """mkstemp's files are 0600; an output should be as readable as any file written."""
    umask = os.umask(0o022)
    os.umask(umask)
    path = tmp_path / "schedule.json"
    write_json_atomically(path, {"a": 1})
    assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


# --- bugs ------------------------------------------------------------------------------


def test_a_bug_is_one_line_and_exit_status_3(tmp_path, monkeypatch):
    def broken(*_: object) -> SolveResult:
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr(cli_module, "solve_within_budget", broken)
    output = tmp_path / "out" / "schedule.json"
    run = run_cli(solve_argv(VGG, "0.9", output))
    assert run.code == 3
    assert run.err.startswith("memplan: internal error: ZeroDivisionError: float division")
    assert run.err.count("\n") == 1 and not output.parent.exists()
    with pytest.raises(ZeroDivisionError):
        main([*solve_argv(VGG, "0.9", output), "--verbose"])


def test_every_error_memplan_raises_is_a_memplan_error():
    """The API's typed exceptions share one base a caller can catch."""
    for error in (BudgetError, GraphError, InfeasibleBudget, ModelFileError, PlanFileError):
        assert issubclass(error, MemplanError)
