"""`python -m benchmarks.compiled`: memplan against torch.compile, on the path users take.

Each model of the head-to-head (benchmarks/models.py, at its sizes) trains under:
- eager, the reference for gradients and the plot's unit of time;
- `torch.compile(model)` (inductor, the default backend) at each
  `torch._functorch.config.activation_memory_budget` of PYTORCH_BUDGETS (1.0 to 0.0);
- `torch.compile(model, backend=memplan.backend(budget=..., inner="inductor"))` at 90%, 70%
  and 50% of the step's unplanned peak, at its least feasible budget, at each of
  torch.compile's measured peaks as an absolute budget ("matched <budget>"), and at
  LOWER_REQUIRED below the least of them (the second target's question, asked directly).

Each run compiles afresh (Dynamo is reset) on a copy of the model; its first training
step, compile included, is timed; then the allocator reads the peak of a steady step
(memplan.tools.verify.steady_step_peak), the gradients are compared with eager's and its
step time is taken: eager's median times the median, over `--repeats` pairs, of the run's
step over an eager step timed just before it (the machine's drift over a model's runs
cancels). For memplan, the plans' predicted peaks
are kept to compare with the allocator, and where the allocator's peak is above them (by
over LISTED_ABOVE), what one more step held at its peak (memplan/planner/peak_contents.py).
A run that raises is recorded as "error: ..." and the benchmark goes on. Writes
benchmarks/results/compiled-<device>.json after each run (a model's earlier complete runs
stay there until its new ones are complete; a stopped run's are kept beside them), one
plot per model (docs/img/compiled_<model>_<device>.png) and that device's section of
docs/results.md (between `markers(device)`; `compiled_section` gives the same text to
benchmarks.models' results_markdown). The models train on CUDA where it is available
(`--device`).
Run: `python -m benchmarks.compiled [--help]`; a smoke run (its figures are no results):
`python -m benchmarks.compiled --models cnn --sizes small --budgets 1.0 0.0 --shares 50%
--out /tmp/smoke`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from rich.console import Console
from rich.progress import Progress
from torch import nn

import memplan
from benchmarks.models import (
    LEAST,
    LOWER_REQUIRED,
    SIZES,
    SLOWER_ALLOWED,
    SOLVERS,
    Bench,
    Run,
    _front,
    machine,
    model_targets,
    pytorch_label,
    smallest_point,
)
from benchmarks.pages import measured_on, saved_section, write_section
from benchmarks.paths import DOCS, RESULTS
from memplan import compat
from memplan.compile.backend import MemplanBackend
from memplan.core.budget import Budget
from memplan.core.errors import InfeasibleBudget, MemplanError, cause_of
from memplan.core.files import write_json_atomically
from memplan.core.units import format_bytes
from memplan.planner.measure import paired_step_seconds
from memplan.planner.options import PlanOptions
from memplan.planner.peak_contents import live_at_peak
from memplan.planner.plan_file import Plan
from memplan.tools.compare import PYTORCH_BUDGETS
from memplan.tools.verify import compare_grads, steady_step_peak, training_step
from memplan.tools.zoo import ZOO

SHARES = ("90%", "70%", "50%")
# What a smoke run shrinks each size of benchmarks.models.SIZES to (at most): every model
# compiles in seconds and steps in milliseconds. Its figures are not results.
SMALL = {"batch": 2, "seq": 32, "image": 32, "layers": 2, "width": 32, "channels": 8, "blocks": 2}
PRESETS = ("bench", "small")
DEVICES = ("cpu", "cuda")
# The setting of the run at LOWER_REQUIRED below torch.compile's least measured peak.
BELOW_LEAST = f"{1 - LOWER_REQUIRED:.0%} of pytorch least"
# The memplan runs --skip can leave out, by name.
SKIPPABLE = ("least", "matched", "below")
AT_PEAK_KEPT = 8  # groups of blocks kept from the peak of a run measured above its prediction
# How far above its prediction a run's peak must be for its blocks to be listed: bytes, not
# a block (LLaMA's 32 B buffer that no graph reads, docs/measurement.md), are no list's.
LISTED_ABOVE = 0.001
# Seconds of back-to-back pairs a head-to-head timing fills, at least (head_to_head_pairs).
HEAD_TO_HEAD_SECONDS = 30.0
# --time-limit's default until 2026-11-27, when it became the backend's own: the models whose
# entries do not record their limit were run at it.
EARLIER_TIME_LIMIT = 20.0


@dataclass(frozen=True)
class CompiledRun(Run):
    """A Run through torch.compile. method is "eager", "pytorch" (torch.compile's default
    at an activation memory budget) or "memplan" (memplan's backend, inductor inside);
    plan_seconds is the first training step's wall time, compile included; for memplan,
    budget is the largest of its graphs' budgets and predicted_peak the sum of their
    predicted peaks (with one graph, that graph's)."""

    graphs: int = 0  # graphs Dynamo compiled in the run: one per graph break and recompile
    graph_peaks: list[int] = field(default_factory=list)  # memplan's prediction per graph
    notes: list[str] = field(default_factory=list)  # memplan's plan notes
    # Where the measured peak is above the prediction: the largest groups of blocks live
    # at it, [bytes each, count, where allocated], read on one more step (peak_contents).
    at_peak: list[list[Any]] = field(default_factory=list)
    # The median wall time of the run's own steps. step_seconds is drift-corrected: the
    # median of each step's time over an eager step's timed just before it, times eager's
    # step_seconds (Compiled._measure); eager's own run has the two equal.
    raw_step_seconds: float | None = None
    # Per graph, memplan's rounds under Inductor: [budget aimed at, peak as compiled,
    # whether layout optimization was on] (MemplanBackend.compile), the kept one among them.
    rounds: list[list[list[Any]]] = field(default_factory=list)
    # Per graph, whether Inductor compiled memplan's kept round with layout optimization.
    layout_optimization: list[bool] = field(default_factory=list)
    # A run timed head to head (the matched runs, each against its torch.compile point; the
    # below-least run, against the least one; torch.compile's first point, against itself,
    # the noise floor): that point's setting, and the median over `against_pairs` pairs
    # (head_to_head_pairs) of this run's step time over a step of that point's twin,
    # compiled beside it in the same process, each pair timed back to back.
    against: str = ""
    against_ratio: float | None = None
    against_pairs: int = 0

    @property
    def prediction_error(self) -> float | None:
        """The allocator's peak against memplan's prediction, as a fraction."""
        if not self.measured or not self.predicted_peak:
            return None
        return self.measured_peak / self.predicted_peak - 1  # type: ignore[operator]


@dataclass(frozen=True)
class Outputs:
    """Where a run writes: the JSON's folder, and the page's folder (images under img/).
    `--out DIR` puts all three in DIR, where the page's image links still resolve."""

    results: Path
    docs: Path

    @classmethod
    def under(cls, out: Path | None) -> Outputs:
        return cls(RESULTS, DOCS) if out is None else cls(out, out)

    @property
    def page(self) -> Path:
        return self.docs / "results.md"

    def image(self, name: str) -> Path:
        return self.docs / "img" / name


def sizes_of(name: str, preset: str) -> dict[str, int]:
    """The model's sizes at the head-to-head ("bench") or shrunk for a smoke run."""
    full = SIZES[name]
    return full if preset == "bench" else {k: min(v, SMALL[k]) for k, v in full.items()}


def one_line(error: BaseException) -> str:
    """The innermost cause of `error` on one line (at most 300 characters): Dynamo wraps a
    backend's exception in BackendCompilerFailed, whose message tells the whole story over
    several lines."""
    while True:
        inner = error.__cause__ or getattr(error, "inner_exception", None)
        if not isinstance(inner, BaseException):
            break
        error = inner
    return f"{type(error).__name__}: {' '.join(str(error).split())}"[:300]


def compiled_graphs() -> int:
    """Graphs Dynamo has compiled in this process (its counters outlive a reset)."""
    return torch._dynamo.utils.counters["stats"]["unique_graphs"]


class Compiled:
    """One model's runs through torch.compile, each on a fresh copy of the model, measured
    against Bench's eager gradients."""

    def __init__(
        self,
        bench: Bench,
        solver: str,
        time_limit: float,
        head_to_head_seconds: float = HEAD_TO_HEAD_SECONDS,
    ) -> None:
        self.bench = bench
        self.solver = solver
        self.time_limit = time_limit
        self.head_to_head_seconds = head_to_head_seconds  # what each head-to-head fills
        self.eager_seconds: float | None = None  # eager's median step, set by eager()
        self.plans: list[Plan] = []  # the plans of the last memplan run, set by memplan()

    def eager(self) -> CompiledRun:
        run = self.bench.eager()
        assert run.step_seconds is not None
        self.eager_seconds = run.step_seconds
        return CompiledRun(**asdict(run), raw_step_seconds=run.step_seconds)

    def pytorch(self, budget: float, against_itself: bool = False) -> CompiledRun:
        """torch.compile's default at activation_memory_budget `budget`. The patch holds
        for the whole run: compilation is lazy (the partitioner runs on the first call),
        and a recompile later would otherwise partition at the default budget. With
        `against_itself`, the run is also timed head to head against a twin of itself: the
        noise floor of the head-to-head verdicts."""
        setting = pytorch_label(budget)
        run = CompiledRun(self.bench.example.name, "pytorch", setting, None, "ok")
        patch = compat.activation_memory_budget(budget)
        return self._measure(run, torch.compile, patch, against=setting if against_itself else "")

    def memplan(
        self,
        setting: str,
        budget: int | str,
        spent: float = 0.0,
        against: str = "",
        **options: Any,
    ) -> CompiledRun:
        """memplan's backend at `budget` (a share, or bytes per graph), with the backend's
        `options` (memplan.backend's keywords); `spent` is planning time already spent on
        this run (the least budget's probe); `against`, a torch.compile setting to time the
        run head to head against (_head_to_head)."""
        run = CompiledRun(self.bench.example.name, "memplan", setting, self.solver, "ok")
        backends: list[MemplanBackend] = []

        def compile_(model: nn.Module) -> nn.Module:
            # The backend is built here, inside _measure: a bad budget is the run's error.
            backends.append(self._backend(budget, **options))
            return torch.compile(model, backend=backends[-1])

        def predicted() -> int:
            return sum(p.peak for p in backends[0].plans)

        run = self._measure(run, compile_, contextlib.nullcontext(), predicted, against)
        run = dataclasses.replace(run, plan_seconds=run.plan_seconds + spent)
        self.plans = backends[0].plans if backends else []
        return _with_plans(run, self.plans)

    def least(self) -> CompiledRun:
        """memplan at its least feasible budget, found as benchmarks.models finds it: the
        smallest feasible peak InfeasibleBudget reports for a 1-byte budget, then planned
        for as an absolute budget (a plan at that budget can be faster than the least-memory
        solve that found it)."""
        started = time.perf_counter()
        try:
            budget = self._least_budget()
        except Exception as error:
            run = CompiledRun(self.bench.example.name, "memplan", LEAST, self.solver, "ok")
            seconds = time.perf_counter() - started
            return dataclasses.replace(
                run, status=f"error: {one_line(error)}", plan_seconds=seconds
            )
        return self.memplan(LEAST, budget, spent=time.perf_counter() - started)

    def _backend(self, budget: int | str, **options: Any) -> MemplanBackend:
        return memplan.backend(
            budget=budget,
            solver=self.solver,
            inner="inductor",
            progress=False,
            time_limit=self.time_limit,
            **options,
        )

    def _least_budget(self) -> int:
        """The smallest feasible budget of the model's first graph: best_effort is off, so
        a 1-byte budget raises InfeasibleBudget (through Dynamo), naming the least peak of
        the graph as Inductor compiled the rounds, before the step runs."""
        torch._dynamo.reset()
        backend = self._backend("1 B", best_effort=False)
        model = copy.deepcopy(self.bench.model)
        try:
            training_step(torch.compile(model, backend=backend), self.bench.inputs)()
        except Exception as error:
            infeasible = cause_of(error, InfeasibleBudget)
            if not isinstance(infeasible, InfeasibleBudget):
                raise
            return infeasible.smallest_feasible
        raise MemplanError("memplan met a 1-byte budget")

    def _measure(
        self,
        run: CompiledRun,
        compile_: Callable[[nn.Module], nn.Module],
        context: contextlib.AbstractContextManager[Any],
        predicted: Callable[[], int] | None = None,
        against: str = "",
    ) -> CompiledRun:
        """`run` compiled by `compile_` on a fresh copy of the model inside `context`: the
        first step's time, the steady step's peak, the gradients' error and the median
        step time; or the error it raised, in one line. Where the peak is above what
        `predicted` says, what one more step held at its peak. Where `against` names a
        torch.compile setting, the step timed head to head against it."""
        torch._dynamo.reset()  # each setting compiles afresh, not from the last one's cache
        model = copy.deepcopy(self.bench.model)
        inputs, device = self.bench.inputs, self.bench.device
        before = compiled_graphs()
        started = time.perf_counter()
        try:
            with context:
                compiled = compile_(model)
                training_step(compiled, inputs)()  # compiles: Dynamo and AOTAutograd are lazy
                first = time.perf_counter() - started
                peak = steady_step_peak(compiled, model, inputs)
                error, match = compare_grads(model, self.bench.eager_grads)
                step = training_step(compiled, inputs)
                raw, ratio = self._paired_seconds(step)
                held = []
                if predicted is not None and peak > predicted() * (1 + LISTED_ABOVE):
                    for param in model.parameters():
                        param.grad = None  # as in the steady step measured
                    held = live_at_peak(step, device)[:AT_PEAK_KEPT]
                graphs = compiled_graphs() - before  # the twin's graph is not the run's
                same = run.method == "pytorch"
                against_ratio, pairs = (
                    self._head_to_head(step, raw, against, same) if against else (None, 0)
                )
        except Exception as failure:
            seconds = time.perf_counter() - started
            return dataclasses.replace(
                run, status=f"error: {one_line(failure)}", plan_seconds=seconds
            )
        return dataclasses.replace(
            run,
            measured_peak=peak,
            step_seconds=ratio * self._eager_seconds(),
            raw_step_seconds=raw,
            plan_seconds=first,
            grads_match=match,
            max_grad_error=error,
            graphs=graphs,
            at_peak=[[g.nbytes, g.count, g.site] for g in held],
            against=against,
            against_ratio=against_ratio,
            against_pairs=pairs,
        )

    def _eager_seconds(self) -> float:
        """Eager's median step, the unit of every run's time: eager() runs first."""
        if self.eager_seconds is None:
            raise MemplanError("a run was timed before eager's, the unit of its time")
        return self.eager_seconds

    def _head_to_head(
        self,
        step: Callable[[], None],
        step_seconds: float,
        setting: str,
        same_backend: bool = False,
    ) -> tuple[float, int]:
        """The median, over head_to_head_pairs pairs timed back to back (which runs first
        alternating), of `step`'s time (about `step_seconds`) over a step of torch.compile
        at activation memory budget `setting`, compiled here on another copy of the model,
        and the count of pairs. Paired with eager, each run's time
        carries two medians' noise, wider on a shared 2-core CPU than the 2% of slack the
        first target allows: CNN's matched 0.8 and 0.6 runs of 2026-11-28, one plan (same
        peak and decisions), read 451.0 and 491.2 ms (benchmarks/results/compiled-cpu.json).
        Dynamo is not reset for the twin: `step`'s backend differs, so neither's compiled
        graphs serve the other's calls, or it is the same (`same_backend`, a point against
        itself) and the twin may run `step`'s graph. More compiled graphs than the twin's
        (a recompile) fail the run."""
        pairs = head_to_head_pairs(self.bench.repeats, step_seconds, self.head_to_head_seconds)
        model = copy.deepcopy(self.bench.model)
        before = compiled_graphs()
        with compat.activation_memory_budget(float(setting)):
            twin = training_step(torch.compile(model), self.bench.inputs)
            twin()  # compiles, inside the patch: the partitioner runs on the first call
            _, ratio = paired_step_seconds(
                step,
                twin,
                device=self.bench.device,
                repeats=pairs,
                alternate=True,
            )
        twins = compiled_graphs() - before
        if twins > 1 or (twins == 0 and not same_backend):
            raise MemplanError(f"{twins} graphs compiled for a head-to-head twin, not 1")
        return ratio, pairs

    def _paired_seconds(self, step: Callable[[], None]) -> tuple[float, float]:
        """`step`'s median time, and its median over an eager step's timed just before
        each of its steps (measure.paired_step_seconds): the machine's speed drifts over a
        model's runs (on a shared 2-core CPU a plan timed minutes after another, planned
        for more memory and predicted as fast, read 17% slower)."""
        model = self.bench.model
        eager = training_step(model, self.bench.inputs)
        try:
            return paired_step_seconds(
                step, eager, device=self.bench.device, repeats=self.bench.repeats
            )
        finally:
            for param in model.parameters():  # eager's gradients are kept elsewhere
                param.grad = None


def _with_plans(run: CompiledRun, plans: list[Plan]) -> CompiledRun:
    """`run` with what memplan's plans say: budget, predicted peak, decisions, notes."""
    if not plans:
        if run.status == "ok":
            return dataclasses.replace(run, status="error: memplan planned no graph")
        return run
    decisions = {d: sum(p.counts()[d] for p in plans) for d in plans[0].counts()}
    return dataclasses.replace(
        run,
        budget=max(p.budget for p in plans),
        predicted_peak=sum(p.peak for p in plans),
        graph_peaks=[p.peak for p in plans],
        decisions=decisions,
        notes=[p.note for p in plans if p.note],
        rounds=[p.options.get("compiled_rounds", []) for p in plans],
        layout_optimization=[p.options.get("layout_optimization", True) for p in plans],
    )


def bench_model(
    name: str,
    preset: str,
    config: argparse.Namespace,
    advance: Callable[[list[CompiledRun], int], None],
) -> list[CompiledRun]:
    """Every run on one model, in order; after each, `advance(the runs so far, how many
    runs of runs_per_model it stands for)`."""
    try:  # builds the model and takes eager's gradients, the reference of every run
        example = ZOO[name](**sizes_of(name, preset)).to(config.device)
        bench = Bench(example, config.repeats, config.time_limit)
        runner = Compiled(bench, config.solver, config.time_limit, config.head_to_head_seconds)
        runs = [runner.eager()]
    except Exception as error:  # nothing to compare with: the model's other runs are void
        runs = [CompiledRun(name, "eager", "", None, f"error: {one_line(error)}")]
        advance(runs, runs_per_model(config))
        return runs
    advance(runs, 1)
    for budget in config.budgets:
        # The first point also timed against a twin of itself: how far from x1 the
        # head-to-head ratios of two equal steps read on this machine.
        runs.append(runner.pytorch(budget, against_itself=budget == config.budgets[0]))
        advance(runs, 1)
    for share in config.shares:
        runs.append(runner.memplan(share, share))
        advance(runs, 1)
    if "least" not in config.skip:
        runs.append(runner.least())
        advance(runs, 1)
    # A memplan point beside every torch.compile point: at its peak, as an absolute budget.
    matched = [] if "matched" in config.skip else [r for r in runs if r.method == "pytorch"]
    for point in matched:
        if point.measured:
            assert point.measured_peak is not None
            runs.append(
                runner.memplan(
                    f"matched {point.setting}", point.measured_peak, against=point.setting
                )
            )
        else:  # nothing to match; counted so that the progress bar still ends
            runs.append(
                CompiledRun(
                    name,
                    "memplan",
                    f"matched {point.setting}",
                    config.solver,
                    "error: the torch.compile point was not measured",
                )
            )
        advance(runs, 1)
    # The second target's question asked directly: memplan at LOWER_REQUIRED below
    # torch.compile's least measured peak, as an absolute budget (the least plan above
    # may recompute more than that peak needs, and so be slower).
    if "below" in config.skip:
        return runs
    measured = [r for r in runs if r.method == "pytorch" and r.measured]
    if measured:
        least = smallest_point(measured)
        below = below_least_budget(least.measured_peak)  # type: ignore[arg-type]
        runs.append(runner.memplan(BELOW_LEAST, below, against=least.setting))
    else:  # counted in runs_per_model, so recorded as the matched runs are
        runs.append(
            CompiledRun(
                name, "memplan", BELOW_LEAST, config.solver,
                "error: no torch.compile point was measured",
            )
        )  # fmt: skip
    advance(runs, 1)
    return runs


def below_least_budget(least_peak: int) -> int:
    """The budget of the run below torch.compile's least measured peak: LOWER_REQUIRED
    below it. A run records the budget it was planned for, which where this one is
    infeasible is the least peak its planner reported instead."""
    return math.floor((1 - LOWER_REQUIRED) * least_peak)


def dominates(peak: int, point_peak: int, ratio: float) -> bool:
    """The first target, of a run timed head to head against a torch.compile point: no
    higher peak, and its step within SLOWER_ALLOWED of the point's."""
    return peak <= point_peak and ratio <= 1 + SLOWER_ALLOWED


def far_enough_below(peak: int, point_peak: int, ratio: float) -> bool:
    """The second target, of a run timed head to head against torch.compile's point of
    least peak: LOWER_REQUIRED lower, its step no slower."""
    return 1 - peak / point_peak >= LOWER_REQUIRED and ratio <= 1


def runs_per_model(config: argparse.Namespace) -> int:
    """Eager, torch.compile's points, memplan's shares, its least, the matched ones, and
    the run below torch.compile's least, less those skipped."""
    matched = 0 if "matched" in config.skip else len(config.budgets)
    least, below = ("least" not in config.skip), ("below" not in config.skip)
    return 1 + len(config.budgets) + len(config.shares) + matched + least + below


# --- the report --------------------------------------------------------------------------


def plot(runs: list[CompiledRun], path: Path) -> None:
    """Measured peak against step time (as a multiple of eager's) for one model: the
    torch.compile points labelled by their activation memory budget, memplan's by setting."""
    eager = runs[0]
    assert eager.step_seconds is not None
    figure, axes = plt.subplots(figsize=(7, 4.5))

    def xy(chosen: list[CompiledRun]) -> tuple[list[float], list[float]]:
        return (
            [r.step_seconds / eager.step_seconds for r in chosen],  # type: ignore[operator]
            [r.measured_peak / 2**20 for r in chosen],  # type: ignore[operator]
        )

    styles = {
        "eager": ("black", "*", 160, "eager"),
        "pytorch": ("tab:blue", "o", 50, "torch.compile (inductor), activation_memory_budget"),
        "memplan": ("tab:red", "^", 50, "memplan backend (inner inductor)"),
    }
    for method, (colour, marker, size, label) in styles.items():
        chosen = [r for r in runs if r.method == method and r.measured]
        if not chosen:
            continue
        xs, ys = xy(chosen)
        axes.scatter(xs, ys, c=colour, marker=marker, s=size, label=label, zorder=3)
        if method != "eager":
            for r, x, y in zip(chosen, xs, ys, strict=True):
                text = r.setting.replace("matched ", "=")
                axes.annotate(
                    text,
                    (x, y),
                    fontsize=7,
                    color=colour,
                    xytext=(4, 3),
                    textcoords="offset points",
                )
    front = _front([r for r in runs if r.method == "memplan" and r.measured])
    if front:
        axes.step(
            *xy(front),
            where="post",
            color="tab:red",
            linewidth=1,
            alpha=0.5,
            label="memplan front",
        )
    axes.set_xlabel("step time / eager")
    axes.set_ylabel("peak by the allocator (MiB)")
    axes.set_title(f"{eager.model} under torch.compile: peak vs step time")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="best")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _dates(saved: dict[str, Any]) -> list[str]:
    """A line naming the run of each model, where the models come from more than one."""
    return measured_on(
        {name: m.get("date", saved["machine"]["date"]) for name, m in saved["models"].items()}
    )


def _unpaired(saved: dict[str, Any]) -> str:
    """The clause naming the models whose runs predate paired timing, if any."""
    older = [
        name
        for name, model in saved["models"].items()
        if any("raw_step_seconds" not in run for run in model["runs"])
    ]
    if not older:
        return ""
    if len(older) == len(saved["models"]):
        return "; every run here predates the pairing: its time is its own median"
    return f"; {', '.join(older)}: measured before the pairing, each run's own median"


def section_text(saved: dict[str, Any]) -> str:
    """The docs section (without its markers) from the saved JSON."""
    where = saved["machine"]
    lines = [
        f"## memplan against torch.compile (inductor), on {where['device_name']}",
        "",
        f"Written by `python -m benchmarks.compiled` ({where['date']}, {saved['sizes']} "
        f"sizes, {where['device_name']}, {where['cpu_threads']} threads, torch "
        f"{where['torch']}); the raw figures are in "
        f"`benchmarks/results/compiled-{where['device']}.json`.",
        "",
        *_dates(saved),
        "The path users take: `torch.compile(model)` (inductor) at each "
        '`torch._functorch.config.activation_memory_budget` ("pytorch 0.8"), against '
        "`torch.compile(model, backend=memplan.backend(budget=..., "
        f'solver="{saved["solver"]}", inner="inductor"))` at a share of the step\'s '
        "unplanned peak, at its least feasible budget (the least peak a 1-byte budget "
        "reports, then planned for), at each of torch.compile's measured peaks as an "
        'absolute budget ("matched 0.8"), and at '
        f'{1 - LOWER_REQUIRED:.0%} of the least of those peaks ("{BELOW_LEAST}": the '
        "second target below, asked as a budget). Each run compiles afresh on a copy of "
        "the model. Peak: the allocator's, of a steady step "
        "(`memplan.tools.verify.steady_step_peak`). Step time: eager's median of "
        f"{saved['repeats']} steps after two warm-ups; for every other run, that times the "
        f"median over {saved['repeats']} pairs of its step's time over an eager step timed "
        "just before it, so that the machine's drift over a model's runs cancels (the "
        "run's own median is `raw_step_seconds` in the JSON"
        f"{_unpaired(saved)}). Compile time: the "
        "first training step's wall time (Dynamo, AOTAutograd, memplan's tracing, "
        "profiling and solving, inductor's code generation, and the step itself; the least "
        "point adds the probe that finds its budget), with inductor's and memplan's "
        "on-disk caches as earlier runs left them. Predicted peak: memplan's plans' "
        "predictions summed over the graphs it compiled (the graphs column: one per graph "
        "break or recompile; with one, that graph's prediction), each the peak of the "
        "graphs as inductor compiled them (`Plan.compiled_peak`: the simulator's peak of "
        "the step as compiled, read from what the compiled graphs allocate, "
        "`memplan/compile/inductor.py` and `memplan/core/emitted.py`); the prediction "
        "error column is the "
        "allocator's peak of the training step against it. Gradients: the "
        "largest absolute difference from eager's. Where a memplan run measures over "
        f"{LISTED_ABOVE:.1%} above its prediction, one more step is recorded and the "
        "largest groups of blocks live at its peak are listed under its table, each "
        "with where it was allocated (`memplan/planner/peak_contents.py`).",
        "",
        f"Targets: (a) memplan dominates every torch.compile point: some memplan run peaks "
        f"no higher and steps no slower, with {SLOWER_ALLOWED:.0%} of slack on time "
        f"(benchmarks.models.SLOWER_ALLOWED, for the noise of a shared machine); (b) at "
        f"torch.compile's smallest peak, memplan's smallest peak among runs no slower is "
        f"at least {LOWER_REQUIRED:.0%} lower. Each model's lines below say whether "
        "they are met, with the figures. Where a model's matched runs and its run below "
        "torch.compile's least were also timed head to head (from 2026-11-28), a table "
        "asks the targets again of them alone: each such run and a twin of its "
        "torch.compile point, compiled side by side in one process, timed back to back "
        f"over at least {least_pairs(saved['repeats'])} pairs (from the second rerun of "
        f"2026-11-28, as many as fill {HEAD_TO_HEAD_SECONDS:g} s, which of the two runs "
        "first alternating; the pairs column), judged on the median of "
        "memplan's step over the point's. Two runs timed apart each carry their own "
        "noise (two runs of one plan can read further apart than the 2% of slack), so "
        "where the verdicts differ, the head-to-head ones are to be trusted; each model's "
        "noise floor, its first torch.compile point timed the same way against a twin of "
        "itself, says how far from x1 two equal steps read in one process. Pairs cancel "
        "the drift within a process, not what differs between processes: one plan, "
        "compiled to the same code, has read about 5% apart in fresh processes, more than "
        "the slack, which a twin sharing its point's code cannot show. "
        "`python -m benchmarks.across_processes` runs each head-to-head again in fresh "
        "processes and judges on the median over them "
        "([measurement](measurement.md#the-head-to-head-across-fresh-processes)).",
        "",
    ]
    for model, found in saved["models"].items():
        runs = [CompiledRun(**r) for r in found["runs"]]
        sizes = ", ".join(f"{k} {v}" for k, v in found["sizes"].items())
        lines += [f"### {model} under torch.compile", "", f"Sizes: {sizes}. {_limit(found)}", ""]
        lines += _stopped(found)
        lines += [*model_targets(runs), ""]  # type: ignore[arg-type]
        lines += head_to_head(runs)
        image = image_name(model, where["device"])
        lines += [f"![{model} under torch.compile](img/{image})", ""]
        lines += table(runs)
        lines += _later_runs(model, found)
    return "\n".join(lines) + "\n"


def least_pairs(repeats: int) -> int:
    """The fewest pairs a head-to-head timing takes where a run's own takes `repeats`:
    more, as the verdict of a target rests on it alone."""
    return 2 * repeats + 1


def head_to_head_pairs(
    repeats: int, step_seconds: float, seconds: float = HEAD_TO_HEAD_SECONDS
) -> int:
    """Pairs a head-to-head timing takes where a run's own takes `repeats` and its step
    `step_seconds`: least_pairs, or as many as fill `seconds`. One pair's ratio scatters
    by about 5% on a 2-core CPU (a one-off probe, ResNet-50, 2026-11-28: a torch.compile
    step against a twin of itself, 40 pairs), so the median of
    11 can read 2% off, the whole of the first target's slack (that model's noise floor
    read x1.042 over 11); the median of 100, about 0.7%."""
    return max(least_pairs(repeats), math.ceil(seconds / (2 * step_seconds)))


def head_to_head(runs: list[CompiledRun]) -> list[str]:
    """The targets asked again of the runs timed head to head, each against its own
    torch.compile point (Compiled._head_to_head): a table and a line per target; nothing
    where no run was (runs taken before 2026-11-28)."""
    points = {r.setting: r for r in runs if r.method == "pytorch" and r.measured}
    timed = [
        r
        for r in runs
        if r.method == "memplan" and r.against_ratio is not None and r.against in points
    ]
    if not timed:
        return []
    lines = [
        "Head to head: each run below and its torch.compile point, compiled side by side "
        "in one process and timed back to back (the step time column is the median of "
        "memplan's step over the point's):",
        "",
        "| memplan run | its peak | torch.compile point | its peak | step time | pairs "
        "| dominates |",
        "|---|---|---|---|---|---|---|",
    ]
    dominated: list[str] = []
    missed: list[str] = []
    for run in timed:
        point = points[run.against]
        ratio = run.against_ratio
        assert ratio is not None and run.measured_peak is not None
        assert point.measured_peak is not None
        held = dominates(run.measured_peak, point.measured_peak, ratio)
        if run.setting != BELOW_LEAST:
            (dominated if held else missed).append(point.setting)
        lines.append(
            f"| {run.label} | {format_bytes(run.measured_peak)} | {point.label} | "
            f"{format_bytes(point.measured_peak)} | x{ratio:.3f} | {run.against_pairs} | "
            f"{'yes' if held else 'no'} |"
        )
    lines.append("")
    if dominated or missed:
        lines.append(
            f"- Head to head, memplan's matched runs dominate {len(dominated)} of "
            f"{len(dominated) + len(missed)} torch.compile points (within "
            f"{SLOWER_ALLOWED:.0%} of their time)"
            + (": every one." if not missed else f"; not {', '.join(missed)}.")
        )
    below = next((r for r in timed if r.setting == BELOW_LEAST), None)
    if below is not None:
        point = points[below.against]
        assert below.measured_peak is not None and point.measured_peak is not None
        assert below.against_ratio is not None
        lower = 1 - below.measured_peak / point.measured_peak
        met = far_enough_below(below.measured_peak, point.measured_peak, below.against_ratio)
        lines.append(
            f"- Head to head at torch.compile's smallest peak ({point.label}, "
            f"{format_bytes(point.measured_peak)}): {below.label} peaks "
            f"{format_bytes(below.measured_peak)}, {lower:.1%} lower, at "
            f"x{below.against_ratio:.3f} its step time; the second target (at least "
            f"{LOWER_REQUIRED:.0%} lower at no more time) is {'met' if met else 'missed'}."
        )
    floor = next((r for r in points.values() if r.against_ratio is not None), None)
    if floor is not None:
        lines.append(
            f"- The noise floor: {floor.label} timed the same way against a twin of itself "
            f"read x{floor.against_ratio:.3f} over {floor.against_pairs} pairs."
        )
    return [*lines, ""]


def _limit(found: dict[str, Any]) -> str:
    """The sentence giving memplan's time limit per solve for a model's runs."""
    if "time_limit" in found:
        return f"memplan's time limit per solve: {found['time_limit']:g} s."
    return (
        f"memplan's time limit per solve: {EARLIER_TIME_LIMIT:g} s, the benchmark's "
        "default when these runs were taken (they predate its being recorded)."
    )


def _stopped(found: dict[str, Any]) -> list[str]:
    """A line where a model's runs were stopped before the end (main's while_running)."""
    if not found.get("complete", True):
        return [f"Incomplete: the benchmark was stopped after {_count(found['runs'])}.", ""]
    if "unfinished" in found:
        later = found["unfinished"]
        return [
            f"A later run ({later['date']}) was stopped after {_count(later['runs'])}; "
            "they are kept in the JSON under `unfinished`, and listed after this model's "
            "table.",
            "",
        ]
    return []


def _later_runs(model: str, found: dict[str, Any]) -> list[str]:
    """The table of a later run that was stopped (the JSON's `unfinished`), below the
    complete one: the newest figures, which the targets above do not count."""
    if "unfinished" not in found:
        return []
    later = found["unfinished"]
    runs = [CompiledRun(**r) for r in later["runs"]]
    if not runs[0].measured:  # no eager step: nothing to give the times against
        return []
    return [
        f"#### {model}: the later run ({later['date']}), stopped after {_count(runs)}",
        "",
        f"{_limit(later)} Not counted in the targets above.",
        "",
        *table(runs),
    ]


def _count(runs: list[Any]) -> str:
    """A count of runs in words: "1 run", "2 runs"."""
    return f"{len(runs)} run{'' if len(runs) == 1 else 's'}"


def table(runs: list[CompiledRun]) -> list[str]:
    """One row per run, then a blank line."""
    eager = runs[0]
    lines = [
        "| run | budget | graphs | predicted peak | measured peak | prediction error | "
        "vs eager | step time | vs eager | compile time | recomputed | max grad error |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [table_row(r, eager) for r in runs]
    notes = sorted({f"{r.label}: {n}" for r in runs for n in r.notes})
    notes += [held_at_peak(r) for r in runs if r.at_peak]
    return [*lines, "", *(f"- {n}" for n in notes), *([""] if notes else [])]


def held_at_peak(r: CompiledRun) -> str:
    """What a run measured above its prediction held at its peak, the largest first."""
    groups = "; ".join(
        f"{count} x {format_bytes(nbytes)} by `{site}`" for nbytes, count, site in r.at_peak
    )
    return f"{r.label}, measured above its prediction, held at its peak: {groups}"


def table_row(r: CompiledRun, eager: Run) -> str:
    """A run's row; a run that failed shows its status instead of figures."""
    budget = "-" if r.budget is None else format_bytes(r.budget)
    predicted = "-" if r.predicted_peak is None else format_bytes(r.predicted_peak)
    if r.predicted_peak is not None and r.budget is not None and r.predicted_peak > r.budget:
        predicted += " (best effort)"  # planned for more than the budget asked
    graphs = str(r.graphs) if r.graphs else "-"
    if not r.measured:
        cells = [r.label, budget, graphs, predicted, r.status, "", "", "", ""]
        return "| " + " | ".join([*cells, f"{r.plan_seconds:.1f} s", "", ""]) + " |"
    assert r.measured_peak is not None and r.step_seconds is not None
    assert eager.measured_peak is not None and eager.step_seconds is not None
    error = "-" if r.prediction_error is None else f"{r.prediction_error:+.1%}"
    moved = str(r.decisions["recompute"]) if r.decisions else "-"
    return (
        f"| {r.label} | {budget} | {graphs} | {predicted} | {format_bytes(r.measured_peak)} | "
        f"{error} | {r.measured_peak / eager.measured_peak:.1%} | "
        f"{r.step_seconds * 1e3:.1f} ms | {r.step_seconds / eager.step_seconds - 1:+.1%} | "
        f"{r.plan_seconds:.1f} s | {moved} | {r.max_grad_error:.1e} |"
    )


def markers(device: str) -> tuple[str, str]:
    """The lines around this benchmark's section of docs/results.md for figures taken on
    `device`: results_markdown (which rewrites the page) keeps them, and a rerun of this
    benchmark alone replaces just that section (benchmarks.pages.write_section)."""
    return (f"<!-- compiled {device}: start -->", f"<!-- compiled {device}: end -->")


def image_name(model: str, device: str) -> str:
    return f"compiled_{model}_{device}.png"


def compiled_section(results: Path = RESULTS) -> list[str]:
    """The sections for docs/results.md with their markers, one per device this benchmark
    has run on (its JSON is there); benchmarks.models' results_markdown adds them."""
    return [
        line
        for device in DEVICES
        for line in saved_section(
            results / f"compiled-{device}.json", section_text, *markers(device)
        )
    ]


def write_report(saved: dict[str, Any], outputs: Outputs) -> None:
    """The plots, and this benchmark's section of the page (the rest of the page stays)."""
    for model, found in saved["models"].items():
        runs = [CompiledRun(**r) for r in found["runs"]]
        if runs[0].measured:  # eager: the plot's unit of time
            plot(runs, outputs.image(image_name(model, saved["machine"]["device"])))
    outputs.page.parent.mkdir(parents=True, exist_ok=True)
    write_section(outputs.page, section_text(saved), *markers(saved["machine"]["device"]))


def command_line(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    *,
    sizes_help: str,
    options: Callable[[argparse.ArgumentParser], None],
    out_help: str,
    stem: str,
    report: Callable[[dict[str, Any], Outputs], None],
) -> tuple[argparse.Namespace, Outputs, dict[str, Any], Path] | None:
    """A benchmark's command line: adds --sizes (help `sizes_help`), the benchmark's own
    `options`, --out (help `out_help`) and --report-only to `parser`, in that order (as
    --help lists them), and parses `argv`; refuses a smoke run that would write into the
    repository. With --report-only, redraws (`report`) from the saved
    `<stem>-<device>.json` and returns None; else returns the arguments, the Outputs, the
    machine and that JSON's path, with UserWarnings silenced: inductor's are noise, and
    memplan's are recorded by the plans or caught per step."""
    parser.add_argument("--sizes", choices=PRESETS, default="bench", help=sizes_help)
    options(parser)
    parser.add_argument("--out", type=Path, default=None, help=out_help)
    parser.add_argument("--report-only", action="store_true", help="redraw from the JSON")
    args = parser.parse_args(argv)
    if args.sizes != "bench" and args.out is None:
        parser.error("--sizes small is a smoke run; its figures are no results: give --out")
    device = getattr(args, "device", machine()["device"])  # an option of some benchmarks
    if device == "cuda" and not args.report_only and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available here")
    outputs = Outputs.under(args.out)
    path = outputs.results / f"{stem}-{device}.json"
    if args.report_only:
        report(json.loads(path.read_text()), outputs)
        return None
    where = machine(device)
    warnings.filterwarnings("ignore", category=UserWarning)
    return args, outputs, where, path


def measurement_command_line(
    parser: argparse.ArgumentParser,
    argv: list[str] | None,
    options: Callable[[argparse.ArgumentParser], None],
    stem: str,
    report: Callable[[dict[str, Any], Outputs], None],
) -> tuple[argparse.Namespace, Outputs, dict[str, Any], Path] | None:
    """command_line for a benchmark at the head-to-head's sizes that writes one JSON and
    its section of docs/measurement.md."""
    return command_line(
        parser,
        argv,
        sizes_help="bench: benchmarks.models.SIZES; small: a smoke run (needs --out)",
        options=options,
        out_help="write the JSON and measurement.md here, not into the repository",
        stem=stem,
        report=report,
    )


def _options(parser: argparse.ArgumentParser) -> None:
    """This benchmark's own options, between --sizes and --out."""
    parser.add_argument(
        "--budgets",
        nargs="+",
        type=float,
        default=list(PYTORCH_BUDGETS),
        help="torch.compile's activation memory budgets",
    )
    parser.add_argument(
        "--shares",
        nargs="*",
        type=_budget,
        default=list(SHARES),
        help="memplan's budgets (none: only its least, matched and below-least runs)",
    )
    parser.add_argument(
        "--skip",
        nargs="+",
        choices=SKIPPABLE,
        default=[],
        help="memplan runs to leave out (a short GPU call): its least, the runs matched "
        "to torch.compile's peaks, the run below torch.compile's least",
    )
    parser.add_argument("--solver", choices=SOLVERS, default="greedy", help="memplan's solver")
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per run (median)")
    parser.add_argument(
        "--head-to-head-seconds",
        type=float,
        default=HEAD_TO_HEAD_SECONDS,
        help="seconds of back-to-back pairs each head-to-head timing fills (at least "
        "2 x repeats + 1 pairs; 0 for a smoke run)",
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=PlanOptions().time_limit,
        help="seconds per solve (default: the backend's own, PlanOptions.time_limit)",
    )
    add_device_option(parser)


def add_device_option(parser: argparse.ArgumentParser) -> None:
    """--device, for a benchmark whose models train on the CPU or a GPU."""
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default=machine()["device"],
        help="where the models train (default: cuda where it is available); with "
        "--report-only, whose figures to redraw",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=list(SIZES), default=list(SIZES))
    parsed = command_line(
        parser,
        argv,
        sizes_help="bench: benchmarks.models.SIZES; small: a smoke run (needs --out)",
        options=_options,
        out_help="write the JSON, plots and page here, not into the repository",
        stem="compiled",
        report=write_report,
    )
    if parsed is None:
        return
    args, outputs, where, path = parsed
    saved = _earlier(path, args, where)
    console = Console()
    with Progress(console=console) as progress:
        task = progress.add_task("compiling", total=runs_per_model(args) * len(args.models))
        for name in args.models:
            earlier = saved["models"].get(name)
            sizes = sizes_of(name, args.sizes)

            def advance(
                runs: list[CompiledRun],
                count: int,
                name: str = name,
                earlier: dict[str, Any] | None = earlier,
                sizes: dict[str, int] = sizes,
            ) -> None:
                progress.update(task, advance=count, description=f"{name}: {runs[-1].label}")
                # After each run: a run cut off by a time limit or a crash keeps what it
                # took, without losing the model's earlier complete runs.
                entry = model_entry(runs, where["date"], sizes, args.time_limit)
                _record(saved, name, while_running(entry, earlier), path)

            runs = bench_model(name, args.sizes, args, advance)
            entry = model_entry(runs, where["date"], sizes, args.time_limit)
            _record(saved, name, entry, path)
    write_report(saved, outputs)
    console.print(f"wrote {path}, {outputs.page} and compiled_*_{args.device}.png")


def model_entry(
    runs: list[CompiledRun], date: str, sizes: dict[str, int], time_limit: float
) -> dict[str, Any]:
    """One model's entry in the JSON: the day its runs were taken, its sizes, memplan's
    time limit per solve (it can decide a plan: a solve the clock cuts keeps its best so
    far) and its runs."""
    return {
        "date": date,
        "sizes": sizes,
        "time_limit": time_limit,
        "runs": [asdict(r) for r in runs],
    }


def while_running(entry: dict[str, Any], earlier: dict[str, Any] | None) -> dict[str, Any]:
    """What the JSON holds for a model whose runs are under way (`entry`, so far): where an
    earlier run left a complete entry, that entry, with these runs beside it as
    "unfinished" (replaced by them once they are complete, kept if they are stopped); else
    these runs, marked incomplete."""
    if earlier is None or not earlier.get("complete", True):
        return {**entry, "complete": False}
    kept = {k: v for k, v in earlier.items() if k != "unfinished"}
    return {**kept, "unfinished": entry}


def _record(saved: dict[str, Any], name: str, entry: dict[str, Any], path: Path) -> None:
    """Sets one model's entry (models in SIZES' order) and writes the JSON."""
    saved["models"][name] = entry
    saved["models"] = {m: saved["models"][m] for m in SIZES if m in saved["models"]}
    write_json_atomically(path, saved)


def _budget(text: str) -> str:
    """A budget as given, once memplan's grammar has read it (a typo fails at once)."""
    Budget.parse(text)
    return text


def _earlier(path: Path, args: argparse.Namespace, where: dict[str, Any]) -> dict[str, Any]:
    """The saved results to merge this run's models into: earlier models are kept where
    they were taken the same way (sizes, solver, repeats), else started afresh."""
    fresh = {
        "machine": where,
        "sizes": args.sizes,
        "solver": args.solver,
        "repeats": args.repeats,
        "models": {},
    }
    if not path.exists():
        return fresh
    saved = json.loads(path.read_text())
    same = all(saved.get(k) == fresh[k] for k in ("sizes", "solver", "repeats"))
    if not same:
        return fresh
    # A model kept from an earlier run keeps that run's date: the page says which is which.
    earlier = saved["machine"]["date"]
    models = {name: {"date": earlier, **model} for name, model in saved["models"].items()}
    return {**fresh, "models": models}


if __name__ == "__main__":
    main()
