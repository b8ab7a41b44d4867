"""`python -m benchmarks.head_to_head`: memplan under torch.compile against torch.compile,
on the zoo and on models beyond it (benchmarks/beyond.py), against the targets a user
weighs memplan by.

Per model, each run in a process of its own (fresh Inductor and memplan caches, so that a
compile's time is a first run's):
- eager, the reference for step times;
- `torch.compile(model)` at each `activation_memory_budget` of TORCH_POINTS;
- `torch.compile(model, backend=memplan.backend(budget=...))` at torch.compile's least
  peak, at LOWER_REQUIRED below it, at the peak of its 0.6 point (the compile time at the
  same point), at each other point's peak (whether memplan dominates that point) and at
  memplan's own least.
Each run's first step (the compile included) is timed and read by the allocator (for
memplan, in a second process: one_run); then a steady step's peak, and its step time
as the median ratio over eager steps timed in pairs with it (paired_step_seconds).
memplan's prediction is the backend's predicted step peak. The targets, per model:
- every memplan prediction within PREDICTED of the allocator's steady peak;
- the first step within its budget, + FIRST_STEP;
- compile time at most COMPILE_AT_POINT x torch.compile's at the same point, and at most
  COMPILE_AT_LEAST x at the least;
- memplan dominates every torch.compile point: a run with no more peak at no more step
  time (within SLOWER_ALLOWED);
- at torch.compile's least peak, a memplan run LOWER_REQUIRED lower at no more step time.
Writes benchmarks/results/head_to_head-<device>.json after each run, one plot
(docs/img/head_to_head_<device>.png) and its section of docs/results.md.
Run: `python -m benchmarks.head_to_head [--models ...] [--device cuda] [--report-only]`;
`--again KIND VALUE` runs one run of each model again (`--again memplan least`). On a GPU
(`--device cuda`) the allocator read is `max_memory_allocated`, so a run's first step is
what the job memplan is for would run out of memory in where it exceeds the budget.
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import torch._functorch.config  # set below; `import torch` alone does not load it

from benchmarks.beyond import BEYOND
from benchmarks.models import LOWER_REQUIRED, SLOWER_ALLOWED, machine, source_commit
from benchmarks.pages import RESULTS_PAGE, write_section
from benchmarks.paths import DOCS, RESULTS
from memplan.core.files import write_json_atomically
from memplan.core.units import format_bytes
from memplan.planner.measure import measure_peak, paired_step_seconds
from memplan.tools.verify import resident_tensors, steady_step_peak, training_step
from memplan.tools.zoo import ZOO, Example

TORCH_POINTS = (1.0, 0.6, 0.2, 0.0)
MATCHED_POINT = 0.6  # the torch.compile point whose peak memplan is also asked for
PREDICTED = 0.02
FIRST_STEP = 0.02
COMPILE_AT_POINT = 1.3
COMPILE_AT_LEAST = 2.0
REPEATS = 5
UNDER_ANY_LEAST = 1024  # bytes
# The zoo's models here, at sizes that keep a run within a few minutes on a 2-core CPU.
ZOO_MODELS = {"mlp": {}, "gpt2": {}, "resnet": {}}
MODELS = [*ZOO_MODELS, *BEYOND]
DEVICES = ("cpu", "cuda")


def markers(device: str) -> tuple[str, str]:
    """The markers of the device's section of the results page."""
    name = "head_to_head" if device == "cpu" else f"head_to_head {device}"
    return f"<!-- {name}: begin -->", f"<!-- {name}: end -->"


def example(name: str) -> Example:
    return ZOO[name](**ZOO_MODELS[name]) if name in ZOO_MODELS else BEYOND[name]()


def floor_bytes(ex: Example) -> int:
    """The least any plan of `ex`'s step can peak at: what is resident before it
    (parameters, buffers, inputs) and the gradient of every trainable parameter, which the
    backward holds together at its end. Only activations are left to a plan."""
    trainable = [p for p in ex.model.parameters() if p.requires_grad]
    tensors = [*resident_tensors(ex.model, ex.inputs), *trainable]
    return sum(t.numel() * t.element_size() for t in tensors)


def with_floors(saved: dict[str, Any]) -> None:
    """Each model of `saved` given its floor (floor_bytes), where it has none yet."""
    for name, entry in saved["models"].items():
        if "floor" not in entry:
            entry["floor"] = floor_bytes(example(name))


def one_run(
    name: str, kind: str, value: str, stage: str = "all", device_type: str = "cpu"
) -> dict[str, Any]:
    """One run of model `name` (this process's only one): "eager", "torch" at an
    activation_memory_budget, or "memplan" at a budget ("least": under any least).

    The first step's peak is read by the allocator's events, which on CPU come from a
    torch.profiler session: memplan planning inside one cannot read transient memory and
    bounds it instead (planner/profile.py), so a memplan run is two processes (in_process):
    stage "all" times its first step unrecorded and measures the rest; stage "first-step"
    then records only the first step, with the plan the first process made (its profile
    and plan caches), compiled and run again."""
    import memplan

    device = torch.device(device_type)
    ex = example(name).to(device)
    model, reference = copy.deepcopy(ex.model), copy.deepcopy(ex.model)
    backend = None
    if kind == "eager":
        run: Any = model
    elif kind == "torch":
        torch._functorch.config.activation_memory_budget = float(value)
        run = torch.compile(model)
    else:
        # One KiB: under any model's least (a plain 1 would be a share, 100%).
        budget = UNDER_ANY_LEAST if value == "least" else int(value)
        backend = memplan.backend(budget=budget, progress=False)
        run = torch.compile(model, backend=backend)
    resident = resident_tensors(model, ex.inputs)
    found: dict[str, Any] = {"kind": kind, "value": value}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a budget under the least says so
        if backend is not None and stage == "first-step":
            first = measure_peak(training_step(run, ex.inputs), resident=resident, device=device)
            return {**found, "first_step_peak": first.peak_bytes}
        started = time.perf_counter()
        if backend is None:
            first = measure_peak(training_step(run, ex.inputs), resident=resident, device=device)
            found["first_step_peak"] = first.peak_bytes
        else:
            training_step(run, ex.inputs)()
        found["first_step_seconds"] = time.perf_counter() - started
        found["peak"] = steady_step_peak(run, model, ex.inputs)
        found["step_seconds"], found["vs_eager"] = paired_step_seconds(
            training_step(run, ex.inputs),
            training_step(reference, ex.inputs),
            device=device,
            repeats=REPEATS,
            alternate=True,
        )
    if backend is not None:
        plans = backend.plans
        found["predicted"] = backend.predicted_step_peak
        found["budget"] = max((p.budget + p.resident + p.outside for p in plans), default=0)
        found["statuses"] = sorted({p.status for p in plans})
        found["rounds"] = sum(len(p.options.get("compiled_rounds", [])) for p in plans)
    return found


def in_process(name: str, kind: str, value: str, device: str = "cpu") -> dict[str, Any]:
    """`one_run` in a fresh process with caches of its own (for memplan, then its
    first step recorded in a second process sharing them); an error is recorded."""
    stages = ["all", "first-step"] if kind == "memplan" else ["all"]
    found: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as caches:
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": f"{caches}/inductor",
            "MEMPLAN_CACHE_DIR": f"{caches}/memplan",
            "HF_HUB_OFFLINE": "1",
        }
        for stage in stages:
            command = [sys.executable, "-m", "benchmarks.head_to_head", "--device", device]
            command += ["--run", name, kind, value, stage]
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode or not lines:
                error = (done.stderr.strip().splitlines() or ["no output"])[-1]
                found = {"kind": kind, "value": value, "error": f"{stage}: {error[:300]}"}
                break
            found.update(json.loads(lines[-1]))
    # --keep mixes runs of different commits in one JSON: each run names its own.
    return {**found, "commit": source_commit()}


def bench_model(
    name: str, record: dict[str, Any], save: Any, keep: Sequence[str] = (), device: str = "cpu"
) -> None:
    """Every run of model `name`, into `record[name]` (saved after each); a run of a kind
    in `keep` that `record` has measured already is kept, not run again."""
    saved = {(r["kind"], r["value"]): r for r in record.get(name, {}).get("runs", [])}
    runs: list[dict[str, Any]] = []
    record[name] = {"runs": runs}

    def add(kind: str, value: str) -> dict[str, Any]:
        earlier = saved.get((kind, value), {})
        kept = kind in keep and "error" not in earlier and earlier
        runs.append(kept or in_process(name, kind, value, device))
        save()
        return runs[-1]

    add("eager", "")
    torch_runs = [add("torch", str(point)) for point in TORCH_POINTS]
    measured = [r for r in torch_runs if "peak" in r]
    if not measured:
        return
    least = min(r["peak"] for r in measured)
    matched = next((r["peak"] for r in measured if r["value"] == str(MATCHED_POINT)), least)
    # Each point's own peak: a point is dominated by a run no higher, and the run that
    # may recompute least for it is the one given its peak as budget.
    points = [r["peak"] for r in measured]
    for budget in dict.fromkeys((least, int((1 - LOWER_REQUIRED) * least), matched, *points)):
        add("memplan", str(budget))
    add("memplan", "least")


def targets(runs: list[dict[str, Any]]) -> dict[str, bool | None]:
    """Which of the module's targets a model's runs meet (None: not measured)."""
    ok = [r for r in runs if "peak" in r]
    torch_runs = [r for r in ok if r["kind"] == "torch"]
    ours = [r for r in ok if r["kind"] == "memplan"]
    if not torch_runs or not ours:
        return dict.fromkeys(TARGETS)
    least_point = min(torch_runs, key=lambda r: r["peak"])
    by_point = {r["value"]: r for r in torch_runs}

    def dominated(point: dict[str, Any]) -> bool:
        return any(
            r["peak"] <= point["peak"] and r["vs_eager"] <= point["vs_eager"] * (1 + SLOWER_ALLOWED)
            for r in ours
        )

    point = by_point.get(str(MATCHED_POINT), {})
    matched = [r for r in ours if r["value"] == str(point.get("peak"))]
    least = [r for r in ours if r["value"] == "least"]
    return {
        "predicted": all(abs(r["predicted"] / r["peak"] - 1) <= PREDICTED for r in ours),
        "first step": all(
            r["first_step_peak"] <= r["budget"] * (1 + FIRST_STEP)
            for r in ours
            if r["statuses"] != ["best-effort"]
        ),
        "compile at a point": bool(matched)
        and matched[0]["first_step_seconds"]
        <= COMPILE_AT_POINT * by_point[str(MATCHED_POINT)]["first_step_seconds"],
        "compile at the least": bool(least)
        and least[0]["first_step_seconds"] <= COMPILE_AT_LEAST * least_point["first_step_seconds"],
        "dominates": all(dominated(p) for p in torch_runs),
        "25% lower": any(
            r["peak"] <= (1 - LOWER_REQUIRED) * least_point["peak"]
            and r["vs_eager"] <= least_point["vs_eager"] * (1 + SLOWER_ALLOWED)
            for r in ours
        ),
    }


TARGETS = (
    "predicted",
    "first step",
    "compile at a point",
    "compile at the least",
    "dominates",
    "25% lower",
)


def under_floor(entry: dict[str, Any]) -> bool:
    """Whether 25% under torch.compile's least peak is below the model's floor."""
    peaks = [r["peak"] for r in entry["runs"] if r["kind"] == "torch" and "peak" in r]
    return bool(peaks) and (1 - LOWER_REQUIRED) * min(peaks) < entry["floor"]


def label(r: dict[str, Any]) -> str:
    if r["kind"] == "eager":
        return "eager"
    if r["kind"] == "torch":
        return f"torch.compile {r['value']}"
    value = "least" if r["value"] == "least" else format_bytes(int(r["value"]))
    return f"memplan at {value}"


def markdown(saved: dict[str, Any]) -> str:
    where = saved["machine"]
    device = where.get("device", "cpu")
    threads = (
        f"{where['cpu_threads']} torch threads, "
        f"{where.get('inductor_compile_threads', '?')} Inductor compile threads"
    )
    on = f"a {where['device_name']} CPU" if device == "cpu" else where["device_name"]
    recorded = (
        "on CPU the allocator is read through a profiler session, inside which memplan "
        "cannot measure transient memory"
        if device == "cpu"
        else "the allocator's `max_memory_allocated` over that step"
    )
    lines = [
        f"Measured on {on} ({threads}), torch {where['torch']}, "
        f"{saved['date']}, by `python -m benchmarks.head_to_head`: each run in a process of "
        "its own with empty caches. Models beyond the zoo are benchmarks/beyond.py's; "
        "nothing of memplan was tuned on them. Step times are medians of the ratio to an "
        f"eager step timed beside it ({REPEATS} pairs); compile time is the first step's. "
        "A memplan run's first-step peak is recorded in a second process that compiles and "
        f"runs the plan the first made, from its caches: {recorded}. A model's "
        "floor is the least any plan can peak at: parameters, buffers and inputs, with the "
        "gradient of each trainable parameter, which the backward holds together at its end; "
        "where 25% under torch.compile's least is below it, no plan can meet that target.",
        "",
        commits(saved),
        "",
        f"![head to head](img/head_to_head_{device}.png)",
        "",
        "| model | floor | " + " | ".join(TARGETS) + " |",
        "|---" * (len(TARGETS) + 2) + "|",
    ]
    for name, entry in saved["models"].items():
        met = targets(entry["runs"])
        cells = ["-" if v is None else ("met" if v else "**not met**") for v in met.values()]
        if met["25% lower"] is False and under_floor(entry):
            cells[TARGETS.index("25% lower")] = "**not met** (under the floor)"
        lines.append(f"| {name} | {format_bytes(entry['floor'])} | " + " | ".join(cells) + " |")
    lines += ["", "| model | run | peak | predicted | first step peak | x eager | compile |"]
    lines.append("|---|---|---|---|---|---|---|")
    for name, entry in saved["models"].items():
        for r in entry["runs"]:
            if "error" in r:
                lines.append(f"| {name} | {label(r)} | {r['error']} | | | | |")
                continue
            predicted = r.get("predicted")
            off = f" ({100 * (predicted / r['peak'] - 1):+.1f}%)" if predicted else ""
            lines.append(
                f"| {name} | {label(r)} | {format_bytes(r['peak'])} | "
                f"{format_bytes(predicted) + off if predicted else ''} | "
                f"{format_bytes(r['first_step_peak'])} | x{r['vs_eager']:.3f} | "
                f"{r['first_step_seconds']:.1f} s |"
            )
    return "\n".join(lines) + "\n"


def commits(saved: dict[str, Any]) -> str:
    """Which commit's code took which runs, as a sentence for the page."""
    by_commit: dict[str, set[str]] = {}
    for entry in saved["models"].values():
        for r in entry["runs"]:
            kind = "torch.compile" if r["kind"] == "torch" else r["kind"]
            by_commit.setdefault(r.get("commit", "a commit not recorded"), set()).add(kind)
    parts = [f"{', '.join(sorted(kinds))} at {commit}" for commit, kinds in by_commit.items()]
    return "Runs by the code that took them: " + "; ".join(parts) + "."


def plot(saved: dict[str, Any], path: Path) -> None:
    models = list(saved["models"])
    columns = min(4, len(models))
    rows = -(-len(models) // columns)
    figure, axes = plt.subplots(rows, columns, figsize=(4 * columns, 3.3 * rows), squeeze=False)
    for ax, name in zip(axes.flat, models, strict=False):
        for kind, marker in (("torch", "o"), ("memplan", "s"), ("eager", "x")):
            runs = [r for r in saved["models"][name]["runs"] if r["kind"] == kind and "peak" in r]
            ax.scatter(
                [r["peak"] / 2**20 for r in runs],
                [r["vs_eager"] for r in runs],
                marker=marker,
                label=kind if kind != "torch" else "torch.compile",
            )
        ax.set_title(name)
        ax.set_xlabel("steady peak (MiB)")
        ax.set_ylabel("step time / eager")
    for ax in list(axes.flat)[len(models) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def report(saved: dict[str, Any]) -> None:
    device = saved["machine"].get("device", "cpu")
    plot(saved, DOCS / "img" / f"head_to_head_{device}.png")
    write_section(RESULTS_PAGE, markdown(saved), *markers(device))


def compile_threads() -> int:
    """How many threads Inductor compiles with here (TORCHINDUCTOR_COMPILE_THREADS, else
    its default for this machine)."""
    from torch._inductor import config

    return int(config.compile_threads or 1)


def run_again(
    name: str, runs: list[dict[str, Any]], kind: str, value: str, device: str = "cpu"
) -> None:
    """The run of `kind` at `value` in model `name`'s `runs` replaced by a new one (where
    the benchmark's code changed for it), where it has one."""
    for i, r in enumerate(runs):
        if (r["kind"], r["value"]) == (kind, value):
            runs[i] = in_process(name, kind, value, device)


def run_models(args: argparse.Namespace, path: Path, saved: dict[str, Any]) -> None:
    """The runs `args` ask for, model by model, into `saved` (written to `path` after
    each run)."""
    for name in args.models:
        if args.again:
            run_again(name, saved["models"][name]["runs"], *args.again, device=args.device)
            write_json_atomically(path, saved)
        else:
            save = functools.partial(write_json_atomically, path, saved)
            bench_model(name, saved["models"], save, args.keep, device=args.device)
        print(name, targets(saved["models"][name]["runs"]), flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="*", default=MODELS, choices=MODELS)
    parser.add_argument("--report-only", action="store_true", help="rewrite the page from JSON")
    parser.add_argument("--device", choices=DEVICES, default="cpu", help="where the runs run")
    parser.add_argument(
        "--keep",
        nargs="*",
        default=[],
        choices=["eager", "torch", "memplan"],
        help="keep the saved JSON's runs of these kinds, measured already",
    )
    parser.add_argument(
        "--again",
        nargs=2,
        metavar=("KIND", "VALUE"),
        help="run each model's run of KIND at VALUE again, in its place in the saved JSON",
    )
    parser.add_argument(
        "--run", nargs=4, metavar=("MODEL", "KIND", "VALUE", "STAGE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.run:
        print(json.dumps(one_run(*args.run, device_type=args.device)), flush=True)
        return
    path = RESULTS / f"head_to_head-{args.device}.json"
    if args.report_only and not path.exists():
        parser.error(f"{path} does not exist: no runs to report")
    saved: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {"models": {}}
    if not args.report_only:
        if args.device == "cuda" and not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA device here")
        saved.update(machine=machine(args.device), date=time.strftime("%Y-%m-%d"))
        saved["machine"]["inductor_compile_threads"] = compile_threads()
        run_models(args, path, saved)
    with_floors(saved)
    write_json_atomically(path, saved)
    report(saved)


if __name__ == "__main__":
    main()
