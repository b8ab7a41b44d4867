"""`make bench`: memplan against what PyTorch already gives, on the model zoo.

Each model trains one step under each method:
- eager;
- torch.utils.checkpoint around every block (the zoo names each model's block class);
- PyTorch's min-cut partitioner (what torch.compile's "aot_eager_decomp_partition" runs)
  at each activation memory budget of memplan.tools.compare.PYTORCH_BUDGETS;
- memplan with each solver at 90%, 70%, 50% and 30% of the eager peak and at its smallest
  feasible budget, and memplan's MATCHED_SOLVER at each of PyTorch's measured peaks.

Every method is measured the same way: the allocator's peak for one step (on CPU the
profiler's allocation events, on a GPU max_memory_allocated; the eager peak includes
parameters, inputs, gradients, activations and kernels' own buffers), the median step time
of `--repeats` steps after two warm-up steps, the planning (or compile) time, and the
gradients against eager's. Writes benchmarks/results/models-<device>.json after each
model (models merge into earlier results: a model's earlier runs are replaced once its new
ones are complete, and each model keeps the day it was measured), one Pareto plot per model
under docs/img/ and docs/results.md.
Run: `python -m benchmarks.models [--help]`.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import subprocess
import time
import warnings
from collections.abc import Callable, Iterator
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
from benchmarks.pages import measured_on
from benchmarks.paths import DOCS, RESULTS
from memplan.core.errors import InfeasibleBudget, MemplanError
from memplan.core.units import format_bytes
from memplan.planner.measure import measure_peak, median_step_seconds
from memplan.tools.compare import PYTORCH_BUDGETS, checkpoint_blocks, pytorch_partitioned
from memplan.tools.verify import compare_grads, resident_tensors, training_step
from memplan.tools.zoo import ZOO, Example

# The models, sized so that activations, not parameters, dominate the peak and a
# CPU step takes a fraction of a second to a few seconds on a 2-core machine.
SIZES: dict[str, dict[str, int]] = {
    "gpt2": {"batch": 8, "seq": 256, "layers": 6, "width": 128},
    "bert": {"batch": 8, "seq": 256, "layers": 6, "width": 128},
    "vit": {"batch": 32, "image": 64, "layers": 6, "width": 128},
    "resnet50": {"batch": 16, "image": 96, "width": 16},
    "llama": {"batch": 8, "seq": 256, "layers": 6, "width": 128},
    "cnn": {"batch": 32, "image": 64, "channels": 32, "blocks": 4},
}
SOLVERS = ("greedy", "chain_dp", "linear", "director", "milp", "cpsat")
SHARES = ("90%", "70%", "50%", "30%")
LEAST = "least"
MATCHED_SOLVER = "milp"  # the fastest plans on the training-solver benchmark
# Targets of the head-to-head (docs/results.md reports each).
SLOWER_ALLOWED = 0.02  # a memplan point dominates a PyTorch point within 2% of its time
LOWER_REQUIRED = 0.25  # at PyTorch's smallest peak, memplan's is 25% lower


@dataclass(frozen=True)
class Run:
    """One model under one method and setting: what was predicted and measured."""

    model: str
    method: str  # "eager", "checkpoint", "pytorch" or "memplan"
    setting: str  # PyTorch's budget, memplan's share, "least" or "matched <budget>"
    solver: str | None
    status: str  # "ok", "infeasible" (memplan found no plan) or "error: ..."
    budget: int | None = None  # memplan's budget in bytes
    predicted_peak: int | None = None
    measured_peak: int | None = None
    step_seconds: float | None = None
    plan_seconds: float = 0.0
    grads_match: bool | None = None
    max_grad_error: float | None = None
    decisions: dict[str, int] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return " ".join(x for x in (self.method, self.solver, self.setting) if x)

    @property
    def measured(self) -> bool:
        return self.status == "ok" and self.measured_peak is not None


def machine(device: str | None = None) -> dict[str, Any]:
    """Where the figures were taken: on `device` ("cpu" or "cuda"; by default cuda where it
    is available)."""
    cuda = torch.cuda.is_available() if device is None else device == "cuda"
    return {
        "device": "cuda" if cuda else "cpu",
        "device_name": torch.cuda.get_device_name() if cuda else platform.machine(),
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
    }


def source_commit() -> str:
    """The commit whose code took a figure: its short hash, with "+changes" where memplan's
    or the benchmarks' code differs from it (results files aside); "unknown" outside git."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=root)

    head = git("rev-parse", "--short", "HEAD")
    if head.returncode:
        return "unknown"
    code = ["memplan", "benchmarks", ":!benchmarks/results"]
    changed = git("status", "--porcelain", "--", *code).stdout.strip()
    return head.stdout.strip() + ("+changes" if changed else "")


class Bench:
    """One model's runs: eager's gradients as the reference, and the measurement of each
    method's module (which shares the model's parameters, or is a copy of them)."""

    def __init__(self, example: Example, repeats: int, time_limit: float) -> None:
        self.example = example
        self.model, self.inputs = example.model, example.inputs
        self.device = next(self.model.parameters()).device
        self.repeats = repeats
        self.time_limit = time_limit
        training_step(self.model, self.inputs)()  # warm-up, then the reference gradients
        self._clear(self.model)
        training_step(self.model, self.inputs)()
        self.eager_grads = {n: p.grad for n, p in self.model.named_parameters()}
        self._clear(self.model)

    @staticmethod
    def _clear(module: nn.Module) -> None:
        for p in module.parameters():
            p.grad = None

    def measure(self, run: Run, module: nn.Module, owner: nn.Module | None = None) -> Run:
        """`run` with the peak, step time and gradient check of `module` filled in; the
        gradients land on `owner`'s parameters (the model's, unless `module` copied it)."""
        owner = self.model if owner is None else owner
        step = training_step(module, self.inputs)
        self._clear(module)
        step()  # a first step sets up what later steps reuse; not the method's memory
        self._clear(module)
        peak = measure_peak(
            step, resident=resident_tensors(module, self.inputs), device=self.device
        ).peak_bytes
        error, match = compare_grads(owner, self.eager_grads)
        seconds = median_step_seconds(step, device=self.device, repeats=self.repeats)
        self._clear(module)
        return _replace(
            run, measured_peak=peak, step_seconds=seconds, grads_match=match, max_grad_error=error
        )

    def eager(self) -> Run:
        run = Run(self.example.name, "eager", "", None, "ok")
        return self.measure(run, self.model)

    def checkpoint(self) -> Run:
        run = Run(self.example.name, "checkpoint", "every block", None, "ok")
        if self.example.block is None:
            return _replace(run, status="error: the zoo names no block for this model")
        copied = checkpoint_blocks(self.model, self.example.block)
        return self.measure(run, copied, owner=copied)

    def pytorch(self, budget: float) -> Run:
        run = Run(self.example.name, "pytorch", pytorch_label(budget), None, "ok")
        started = time.perf_counter()
        module = pytorch_partitioned(self.model, self.inputs, budget)
        return self.measure(_replace(run, plan_seconds=time.perf_counter() - started), module)

    def memplan(self, solver: str, setting: str, budget: int | str) -> Run:
        """memplan with `solver` at `budget` ("70%" or bytes); setting LEAST plans at the
        smallest budget any solve found (its own or greedy's least-memory solve)."""
        run = Run(self.example.name, "memplan", setting, solver, "ok")
        started = time.perf_counter()
        try:
            if setting == LEAST:
                budget = self._least(solver)
            planned = self._optimize(solver, budget)
        except InfeasibleBudget as error:
            return _replace(
                run,
                status="infeasible",
                budget=error.budget,
                predicted_peak=error.smallest_feasible,
                plan_seconds=time.perf_counter() - started,
            )
        except MemplanError as error:  # e.g. this solver found nothing where greedy does
            seconds = time.perf_counter() - started
            return _replace(run, status=f"error: {error}", plan_seconds=seconds)
        plan = planned.plan
        if plan.solver != solver:  # the fallback stood in: this solver found no plan
            seconds = time.perf_counter() - started
            return _replace(run, status=f"error: {plan.note}", plan_seconds=seconds)
        run = _replace(
            run,
            budget=plan.budget,
            predicted_peak=plan.predicted_peak,
            plan_seconds=time.perf_counter() - started,
            decisions=plan.counts(),
        )
        return self.measure(run, planned)

    def _optimize(self, solver: str, budget: int | str) -> memplan.PlannedModule:
        return memplan.optimize(
            self.model,
            self.inputs,
            budget=budget,
            solver=solver,
            time_limit=self.time_limit,
            progress=False,
        )

    def _least(self, solver: str) -> int:
        """The smallest feasible budget InfeasibleBudget reports for a 1-byte budget."""
        try:
            self._optimize(solver, "1 B")
        except InfeasibleBudget as error:
            return error.smallest_feasible
        raise MemplanError(f"{solver} met a 1-byte budget")


def pytorch_label(budget: float) -> str:
    """The setting of PyTorch's run at activation_memory_budget `budget`: "0.6", "0.05"."""
    return f"{budget:.1f}" if round(budget, 1) == budget else f"{budget:.2f}"


def _replace(run: Run, **changes: Any) -> Run:
    return Run(**{**asdict(run), **changes})


def settings(solvers: tuple[str, ...]) -> Iterator[tuple[str, str | None, str]]:
    """(method, solver, setting) of every run but the matched ones, in running order."""
    yield "eager", None, ""
    yield "checkpoint", None, "every block"
    for budget in PYTORCH_BUDGETS:
        yield "pytorch", None, pytorch_label(budget)
    for solver in solvers:
        for setting in (*SHARES, LEAST):
            yield "memplan", solver, setting


def bench_model(
    name: str, solvers: tuple[str, ...], repeats: int, time_limit: float, advance: Callable
) -> list[Run]:
    """Every method on one zoo model at its benchmark size; `advance(label)` after each."""
    bench = Bench(ZOO[name](**SIZES.get(name, {})), repeats, time_limit)
    eager_peak = None
    runs: list[Run] = []
    for method, solver, setting in settings(solvers):
        if method == "eager":
            run = bench.eager()
            eager_peak = run.measured_peak
        elif method == "checkpoint":
            run = bench.checkpoint()
        elif method == "pytorch":
            run = bench.pytorch(float(setting))
        else:
            assert solver is not None and eager_peak is not None
            budget = setting if setting == LEAST else int(float(setting[:-1]) / 100 * eager_peak)
            run = bench.memplan(solver, setting, budget)
        runs.append(run)
        advance(run.label)
    for point in [r for r in runs if r.method == "pytorch" and r.measured]:
        assert point.measured_peak is not None
        run = bench.memplan(MATCHED_SOLVER, f"matched {point.setting}", point.measured_peak)
        runs.append(run)
        advance(run.label)
    return runs


# --- the targets -------------------------------------------------------------------------


def dominating(runs: list[Run], point: Run) -> Run | None:
    """The fastest measured memplan run with a peak at most `point`'s and a step time
    within SLOWER_ALLOWED of it; None if there is none."""
    assert point.measured_peak is not None and point.step_seconds is not None
    limit = point.step_seconds * (1 + SLOWER_ALLOWED)
    found = [
        r
        for r in runs
        if r.method == "memplan"
        and r.measured
        and r.measured_peak <= point.measured_peak  # type: ignore[operator]
        and r.step_seconds <= limit  # type: ignore[operator]
    ]
    return min(found, key=lambda r: r.step_seconds or 0.0, default=None)


def model_targets(runs: list[Run]) -> list[str]:
    """The issue's three targets on one model's runs, each met or missed with figures."""
    memplans = [r for r in runs if r.method == "memplan" and r.measured]
    over = [r for r in memplans if r.measured_peak > r.budget]  # type: ignore[operator]
    lines = [
        f"- Measured peak within the budget: {len(memplans) - len(over)} of {len(memplans)} "
        "memplan runs"
        + (
            ""
            if not over
            else " (over: "
            + ", ".join(
                f"{r.label} by {format_bytes(r.measured_peak - r.budget)}"  # type: ignore[operator]
                for r in over
            )
            + ")"
        )
        + "."
    ]
    points = [r for r in runs if r.method == "pytorch" and r.measured]
    if not points:
        return [*lines, "- No PyTorch partitioner run was measured."]
    missed = []
    for point in points:
        if dominating(runs, point) is None:
            missed.append(f"{point.setting} ({_closest(memplans, point)})")
    lines.append(
        f"- memplan dominates {len(points) - len(missed)} of PyTorch's {len(points)} points"
        + (": every one." if not missed else f"; not {'; '.join(missed)}.")
    )
    smallest = smallest_point(points)
    assert smallest.measured_peak is not None and smallest.step_seconds is not None
    in_time = [r for r in memplans if r.step_seconds <= smallest.step_seconds]  # type: ignore[operator]
    best = min(in_time, key=lambda r: r.measured_peak or 0, default=None)
    if best is None:
        lines.append(
            f"- At PyTorch's smallest peak ({smallest.label}, "
            f"{format_bytes(smallest.measured_peak)}): no memplan run is as fast."
        )
    else:
        lower = 1 - best.measured_peak / smallest.measured_peak  # type: ignore[operator]
        verdict = "met" if lower >= LOWER_REQUIRED else "missed"
        lines.append(
            f"- At PyTorch's smallest peak ({smallest.label}, "
            f"{format_bytes(smallest.measured_peak)}, {smallest.step_seconds * 1e3:.0f} ms): "
            f"memplan's least peak at no more time is {format_bytes(best.measured_peak)} "
            f"({best.label}), {abs(lower):.1%} {'lower' if lower >= 0 else 'higher'}; "
            f"the target of {LOWER_REQUIRED:.0%} lower is {verdict}."
        )
    return lines


def smallest_point(points: list[Run]) -> Run:
    """The PyTorch point of the second target: the least measured peak, the faster of a tie."""
    return min(points, key=lambda r: (r.measured_peak, r.step_seconds))


def _closest(memplans: list[Run], point: Run) -> str:
    """What memplan offers at or below a PyTorch point's peak: the fastest such run."""
    below = [r for r in memplans if r.measured_peak <= point.measured_peak]  # type: ignore[operator]
    if not below:
        return "no memplan run peaks that low"
    fastest = min(below, key=lambda r: r.step_seconds or 0.0)
    slower = fastest.step_seconds / point.step_seconds - 1  # type: ignore[operator]
    return f"the fastest memplan run that low, {fastest.label}, is {slower:+.1%} slower"


# --- the report --------------------------------------------------------------------------


def plot_pareto(runs: list[Run], path: Path) -> None:
    """Measured peak against step time for one model: one marker per run."""
    eager = runs[0]
    assert eager.step_seconds is not None and eager.measured_peak is not None
    figure, axes = plt.subplots(figsize=(7, 4.5))
    styles = {
        "eager": ("black", "*", 160),
        "checkpoint": ("tab:gray", "s", 60),
        "pytorch": ("tab:blue", "o", 50),
    }
    for method in ("eager", "checkpoint", "pytorch"):
        chosen = [r for r in runs if r.method == method and r.measured]
        if chosen:
            colour, marker, size = styles[method]
            axes.scatter(
                [r.step_seconds / eager.step_seconds for r in chosen],  # type: ignore[operator]
                [r.measured_peak / 2**20 for r in chosen],  # type: ignore[operator]
                c=colour,
                marker=marker,
                s=size,
                label="PyTorch partitioner" if method == "pytorch" else method,
                zorder=3,
            )
    memplans = [r for r in runs if r.method == "memplan" and r.measured]
    for index, solver in enumerate(dict.fromkeys(r.solver for r in memplans)):
        chosen = [r for r in memplans if r.solver == solver]
        axes.scatter(
            [r.step_seconds / eager.step_seconds for r in chosen],  # type: ignore[operator]
            [r.measured_peak / 2**20 for r in chosen],  # type: ignore[operator]
            marker="^v<>Dp"[index % 6],
            s=36,
            label=f"memplan {solver}",
            alpha=0.8,
        )
    front = _front(memplans)
    axes.step(
        [r.step_seconds / eager.step_seconds for r in front],  # type: ignore[operator]
        [r.measured_peak / 2**20 for r in front],  # type: ignore[operator]
        where="post",
        color="tab:red",
        linewidth=1,
        label="memplan front",
    )
    axes.set_xlabel("step time / eager")
    axes.set_ylabel("measured peak (MiB)")
    axes.set_title(f"{eager.model}: peak vs step time")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="upper right")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _front(runs: list[Run]) -> list[Run]:
    """The runs no other run beats on both peak and step time, by increasing time."""
    front: list[Run] = []
    for run in sorted(runs, key=lambda r: (r.step_seconds, r.measured_peak)):
        if not front or run.measured_peak < front[-1].measured_peak:  # type: ignore[operator]
            front.append(run)
    return front


def results_markdown(runs: list[Run], where: dict[str, Any], dates: dict[str, str]) -> str:
    """docs/results.md: per model, the targets, the Pareto plot and the table; `dates`,
    the day each model was measured."""
    lines = [
        "# Results: memplan against PyTorch's own memory planning",
        "",
        "Written by `python -m benchmarks.models` (`make bench`); the raw figures are in",
        f"`benchmarks/results/models-{where['device']}.json`. Do not edit by hand.",
        "",
        f"Machine: {where['device_name']} ({where['device']}), {where['cpu_threads']} CPU "
        f"threads, torch {where['torch']}, {where['date']}.",
        "",
        *measured_on(dates),
        "Methods: eager; `torch.utils.checkpoint` around every block; PyTorch's min-cut "
        'partitioner (what `torch.compile(backend="aot_eager_decomp_partition")` runs) at '
        "each `activation_memory_budget`; memplan with each solver at a share of the eager "
        f"peak and at its least feasible budget, and memplan's {MATCHED_SOLVER} at each of "
        "PyTorch's measured peaks (\"matched\"). PyTorch's partitioner is compiled through "
        "memplan's capture with inductor's decompositions and run as the same generated code "
        "as memplan's plans (memplan/tools/compare.py), so that every method runs the same "
        "way and one instrument measures them all.",
        "",
        "Peak: the allocator's peak of one training step (parameters, inputs, gradients, "
        "activations and kernels' own buffers: the profiler's allocation events on CPU, "
        "`max_memory_allocated` on a GPU), what an out-of-memory error counts. Step time: "
        "the median of "
        "several steps after two warm-up steps. Plan time: memplan's tracing, profiling and "
        "solving, or PyTorch's compile. Gradients are compared with eager's (rtol 1e-5, atol "
        "1e-6). Step times on a small shared CPU are noisy to several percent.",
        "",
    ]
    from benchmarks import changing_breaks, graph_breaks, own_checkpointing, repeated_calls
    from benchmarks.compiled import compiled_section  # here: it imports this module
    from benchmarks.inductor_peaks import inductor_peaks_section
    from benchmarks.training_loop import training_loop_section

    lines += sweep_section(where) + compiled_section() + training_loop_section(where)
    lines += inductor_peaks_section(where) + repeated_calls.SECTION.saved(where)
    lines += own_checkpointing.SECTION.saved(where) + graph_breaks.SECTION.saved(where)
    lines += changing_breaks.SECTION.saved(where)
    for model in _models(runs):
        rows = [r for r in runs if r.model == model]
        eager = rows[0]
        lines += [f"## {model}", "", *model_targets(rows), ""]
        lines += [f"![{model}: peak vs step time](img/pareto_{model}.png)", ""]
        lines += [
            "| method | budget | predicted peak | measured peak | vs eager | step time | "
            "vs eager | plan time | recomputed / offloaded | grads = eager |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(_row(r, eager))
        lines.append("")
    return "\n".join(lines)


def sweep_section(where: dict[str, Any]) -> list[str]:
    """The peak as the budget falls (benchmarks/sweep.py), where that has been run."""
    path = RESULTS / f"sweep-{where['device']}.json"
    if not path.exists():
        return []
    saved = json.loads(path.read_text())
    lines = [
        "## The peak as the budget falls",
        "",
        "Written by `python -m benchmarks.sweep` "
        f"({saved['machine']['date']}): memplan (greedy) at every 5% of its unplanned "
        "peak down to its least feasible budget, PyTorch's partitioner at every "
        "`activation_memory_budget` from 1.0 to 0.0 by 0.05, each step read by the "
        "allocator.",
        "",
    ]
    for model, found in saved["models"].items():
        s = found["summary"]
        lines += [
            f"- {model}: memplan's peak rose {s['memplan_rises']} times as its budget fell "
            f"(least {format_bytes(s['memplan_least'])}); PyTorch's rose "
            f"{s['pytorch_rises']} times (least {format_bytes(s['pytorch_least'])}; at 0.0, "
            f"{format_bytes(s['pytorch_at_0'])} against eager's {format_bytes(s['eager'])}).",
            "",
            f"![{model}: the peak as the budget falls](img/sweep_{model}.png)",
            "",
        ]
    return lines


def _row(r: Run, eager: Run) -> str:
    budget = "-" if r.budget is None else format_bytes(r.budget)
    predicted = "-" if r.predicted_peak is None else format_bytes(r.predicted_peak)
    if not r.measured:
        status = "no plan within the budget" if r.status == "infeasible" else r.status
        plan = f"{r.plan_seconds:.1f} s"
        return f"| {r.label} | {budget} | {predicted} | {status} | | | | {plan} | | |"
    assert r.measured_peak is not None and r.step_seconds is not None
    assert eager.measured_peak is not None and eager.step_seconds is not None
    moved = "-" if not r.decisions else f"{r.decisions['recompute']} / {r.decisions['offload']}"
    grads = "yes" if r.grads_match else f"no ({r.max_grad_error:.1e})"
    return (
        f"| {r.label} | {budget} | {predicted} | {format_bytes(r.measured_peak)} | "
        f"{r.measured_peak / eager.measured_peak:.1%} | {r.step_seconds * 1e3:.0f} ms | "
        f"{r.step_seconds / eager.step_seconds - 1:+.1%} | {r.plan_seconds:.1f} s | {moved} | "
        f"{grads} |"
    )


def write_report(runs: list[Run], where: dict[str, Any], dates: dict[str, str]) -> None:
    """The Pareto plots and docs/results.md."""
    for model in _models(runs):
        plot_pareto([r for r in runs if r.model == model], DOCS / "img" / f"pareto_{model}.png")
    (DOCS / "results.md").write_text(results_markdown(runs, where, dates))


def _models(runs: list[Run]) -> list[str]:
    """The models of `runs`, in their order."""
    return list(dict.fromkeys(r.model for r in runs))


def model_dates(saved: dict[str, Any], runs: list[Run]) -> dict[str, str]:
    """The day each model of the saved JSON was measured (a JSON from before the models
    were dated: its machine's date for all)."""
    machine_date = saved.get("machine", {}).get("date", "")
    return {m: saved.get("dates", {}).get(m, machine_date) for m in _models(runs)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(SIZES), default=list(SIZES))
    parser.add_argument("--solvers", nargs="+", choices=SOLVERS, default=list(SOLVERS))
    parser.add_argument("--repeats", type=int, default=5, help="timed steps per run (median)")
    parser.add_argument("--time-limit", type=float, default=20.0, help="seconds per solve")
    parser.add_argument(
        "--report-only", action="store_true", help="rewrite docs/results.md from the saved JSON"
    )
    args = parser.parse_args(argv)
    if args.repeats < 5:
        parser.error("--repeats must be at least 5")
    console = Console()
    where = machine()
    out = RESULTS / f"models-{where['device']}.json"
    saved = json.loads(out.read_text()) if out.exists() else {"runs": []}
    runs = [Run(**r) for r in saved["runs"] if "setting" in r]  # older formats are dropped
    dates = model_dates(saved, runs)
    if args.report_only:
        write_report(runs, saved.get("machine", where), dates)
        return
    per_model = len(list(settings(tuple(args.solvers)))) + len(PYTORCH_BUDGETS)
    warnings.filterwarnings("ignore", category=UserWarning)
    with Progress(console=console) as progress:
        task = progress.add_task("benchmarking", total=per_model * len(args.models))
        for name in args.models:

            def advance(label: str, name: str = name) -> None:
                progress.update(task, advance=1, description=f"{name}: {label}")

            fresh = bench_model(name, tuple(args.solvers), args.repeats, args.time_limit, advance)
            # A model's earlier runs are replaced only once its new ones are complete: a
            # run stopped part way keeps every model it had not finished.
            runs = [r for r in runs if r.model != name] + fresh
            order = {m: i for i, m in enumerate(SIZES)}
            runs.sort(key=lambda r: order.get(r.model, math.inf))
            dates = {m: where["date"] if m == name else dates[m] for m in _models(runs)}
            RESULTS.mkdir(parents=True, exist_ok=True)
            out.write_text(
                json.dumps({"machine": where, "dates": dates, "runs": [asdict(r) for r in runs]})
            )
    write_report(runs, where, dates)
    console.print(f"wrote {out} and {DOCS / 'results.md'}")


if __name__ == "__main__":
    main()
