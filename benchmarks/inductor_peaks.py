"""`python -m benchmarks.inductor_peaks`: what Inductor runs against what memplan predicts.

Each zoo model (at the zoo's own sizes) is compiled with
`torch.compile(model, backend=memplan.backend(budget=B))`, Inductor being the inner
compiler, at 90%, 70% and 50% of its unplanned peak and at its least (a 1 KiB budget,
best effort). The allocator reads one steady training step (memplan.tools.verify.
steady_step_peak), which is compared with the plan's budget and its prediction of what
Inductor runs (Plan.compiled_peak, compile/inductor.py and core/emitted.py). The
convolutional models run again at 70% with Inductor's layout optimization off (it is on
by default, as in torch.compile; `inductor_config={"layout_optimization": False}`). Writes
benchmarks/results/inductor-peaks-<device>.json and its section of docs/results.md.
Run: `python -m benchmarks.inductor_peaks [--models mlp gpt2 ...]`.
"""

from __future__ import annotations

import argparse
import copy
import json
import warnings
from dataclasses import asdict, dataclass
from typing import Any

import torch
from rich.console import Console
from rich.progress import track

import memplan
from benchmarks.models import machine
from benchmarks.pages import write_section
from benchmarks.paths import DOCS, RESULTS
from memplan.core.units import format_bytes
from memplan.tools.verify import steady_step_peak
from memplan.tools.zoo import ZOO

PAGE = DOCS / "results.md"
MARKERS = ("<!-- inductor peaks: start -->", "<!-- inductor peaks: end -->")
MODELS = tuple(ZOO)  # each at the zoo's own sizes: quick steps, activations dominant
CONVOLUTIONAL = ("cnn", "resnet", "resnet50", "convnext")
BUDGETS = ("90%", "70%", "50%", "least")
LEAST_BYTES = 1024  # under every model's least peak: planned for the least, best effort
TOLERANCE = 0.05  # the bound on |measured - predicted| / predicted


@dataclass(frozen=True)
class Row:
    """One model at one budget under Inductor."""

    model: str
    budget: str
    layout_optimization: bool
    budget_bytes: int
    predicted: int  # of what Inductor runs: Plan.peak (Plan.compiled_peak)
    measured: int
    simulated: int = 0  # the plan's peak as planned (Plan.predicted_peak)
    plans: int = 1  # rounds of the search, each compiled and read

    @property
    def error(self) -> float:
        return self.measured / self.predicted - 1


def measure(name: str, budget: str, layout_optimization: bool) -> Row:
    """Compile, plan and run one model at one budget; the allocator's steady step."""
    example = ZOO[name]()
    torch._dynamo.reset()
    asked = LEAST_BYTES if budget == "least" else budget
    # On: memplan's default, where a graph whose check cannot run is compiled without it.
    settings = {} if layout_optimization else {"layout_optimization": False}
    backend = memplan.backend(budget=asked, inductor_config=settings, progress=False)
    model = copy.deepcopy(example.model)
    compiled = torch.compile(model, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the least is planned best effort, with a warning
        measured = steady_step_peak(compiled, model, example.inputs)
    plan = backend.plans[-1]
    rounds = len(plan.options.get("compiled_rounds", [])) or 1
    return Row(
        name,
        budget,
        layout_optimization,
        plan.budget,
        plan.peak,
        measured,
        plan.predicted_peak,
        rounds,
    )


def inductor_peaks_section(where: dict[str, Any]) -> list[str]:
    """The section for docs/results.md with its markers, where this benchmark has run on
    `where`'s device; benchmarks.models' results_markdown adds it to the page."""
    path = RESULTS / f"inductor-peaks-{where['device']}.json"
    if not path.exists():
        return []
    saved = json.loads(path.read_text())
    rows = [Row(**r) for r in saved["rows"]]
    return [MARKERS[0], *markdown(rows, saved["machine"]).splitlines(), MARKERS[1], ""]


def markdown(rows: list[Row], where: dict[str, Any]) -> str:
    """The section of docs/results.md."""
    within = sum(r.measured <= r.budget_bytes for r in rows)
    close = sum(abs(r.error) <= TOLERANCE for r in rows)
    lines = [
        "## The prediction under Inductor",
        "",
        f"Written by `python -m benchmarks.inductor_peaks` ({where['date']}, "
        f"{where['device_name']}, {where['cpu_threads']} threads, torch {where['torch']}); "
        "the raw figures are in `benchmarks/results/inductor-peaks-"
        f"{where['device']}.json`. Each zoo model is compiled with memplan's backend "
        "(Inductor the inner compiler) at each budget; the allocator reads one steady step. "
        "Predicted: the peak of the graphs as Inductor compiled them (`Plan.compiled_peak`: "
        "the simulator's peak of the buffers Inductor's wrapper allocates, reuses and "
        "frees, read from its compile before anything runs, core/emitted.py); simulated: "
        "the simulator's peak of the plan as the solver planned it, for comparison; plans: "
        "the rounds of the search, each planned at an aim, compiled and read "
        "(compile/search.py).",
        "",
        f"- Measured peak within the budget: {within} of {len(rows)} runs.",
        f"- Measured within {TOLERANCE:.0%} of the prediction: {close} of {len(rows)} runs.",
        "",
        "| model | budget | layout optimization | budget bytes | simulated | plans | predicted | "
        "measured | measured vs predicted | within budget |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.model} | {r.budget} | {'on' if r.layout_optimization else 'off'} | "
            f"{format_bytes(r.budget_bytes)} | {format_bytes(r.simulated)} | {r.plans} | "
            f"{format_bytes(r.predicted)} | "
            f"{format_bytes(r.measured)} | {r.error:+.1%} | "
            f"{'yes' if r.measured <= r.budget_bytes else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    args = parser.parse_args()
    cases = [(m, b, True) for m in args.models for b in BUDGETS]
    cases += [(m, b, False) for m in args.models if m in CONVOLUTIONAL for b in BUDGETS[1:2]]
    where = machine()
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"inductor-peaks-{where['device']}.json"
    # The models not run now keep their saved rows, measured by an earlier run; the page
    # names this run's date only.
    saved = json.loads(out.read_text())["rows"] if out.exists() else []
    rows = [Row(**r) for r in saved if r["model"] not in args.models]
    for case in track(cases, description="inductor peaks"):
        rows.append(measure(*case))
        # After each run: a crash keeps the rows before it.
        out.write_text(json.dumps({"machine": where, "rows": [asdict(r) for r in rows]}, indent=1))
    rows.sort(key=lambda r: (not r.layout_optimization, MODELS.index(r.model)))
    write_section(PAGE, markdown(rows, where), *MARKERS)
    Console().print(f"wrote {out} and {PAGE}")


if __name__ == "__main__":
    main()
