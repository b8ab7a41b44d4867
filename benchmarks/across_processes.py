"""`python -m benchmarks.across_processes`: the compiled head-to-heads, in fresh processes.

A head-to-head's back-to-back pairs cancel the machine's drift within one process, not
what differs from one process to the next. ResNet-50's plan at torch.compile 0.8's peak
(31 recomputed, 50.12 MiB; the same generated code each time) read x0.984, x1.031 and
x0.983 against torch.compile 0.8 in three fresh processes of 397 to 464 pairs each
(2-core x86_64, 2026-11-28): a spread over twice the 2% of slack of the first target,
where the median of 400 pairs that scatter by about 5% moves by well under 1%. The noise
floor of benchmarks.compiled, a point against a twin of itself, cannot show it: the twin
runs the same compiled code in the same process. So one process's verdict can turn on the
process.

For each model given, every run of benchmarks/results/compiled-<device>.json timed head
to head there (the runs matched to torch.compile's peaks, the run below torch.compile's
least, and the noise floor: the first torch.compile point against a twin of itself) runs
again in `--processes` fresh processes, each as benchmarks.compiled runs it: eager's
reference, the run compiled afresh on a copy of the model (memplan plans again, or takes
its plan from the plan cache: a solve cut off by its time limit is not cached, so such a
run may plan differently in each process), a twin of its torch.compile point, and
`--seconds` of alternating pairs. The processes take turns over the cases, so that each
case's processes spread over the whole run. Per process: its ratio, its pairs and the
run's measured peak. Verdicts are on the median ratio over the processes; writes
benchmarks/results/across-processes-<device>.json and that device's section of
docs/measurement.md (or both into `--out DIR`). Run it alone: it measures step times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.progress import Progress

from benchmarks.compiled import (
    BELOW_LEAST,
    Compiled,
    Outputs,
    add_device_option,
    below_least_budget,
    dominates,
    far_enough_below,
    measurement_command_line,
    one_line,
    sizes_of,
)
from benchmarks.models import SIZES, Bench
from benchmarks.pages import write_section
from benchmarks.paths import RESULTS, ROOT
from memplan.core.errors import MemplanError
from memplan.core.files import write_json_atomically
from memplan.core.units import format_bytes
from memplan.tools.zoo import ZOO

PAGE = "measurement.md"
PROCESSES = 3  # fresh processes per case
SECONDS = 15.0  # of alternating pairs per process: the spread is between processes
# The line a case's process prints its result on, for the process that started it.
RESULT = "across-processes result: "
FLOOR = "noise floor"


def cases(compiled: dict[str, Any], model: str) -> list[dict[str, Any]]:
    """The runs of `model` in benchmarks.compiled's results that were timed head to head,
    each with what its processes need: its budget (None for the noise floor), its
    torch.compile point and that point's measured peak, and its own head-to-head there."""
    found = compiled["models"][model]
    runs = found["runs"]
    points = {r["setting"]: r for r in runs if r["method"] == "pytorch"}
    return [
        {
            "setting": FLOOR if r["method"] == "pytorch" else r["setting"],
            "budget": _asked(r, points),
            "against": r["against"],
            "point_peak": points[r["against"]]["measured_peak"],
            "time_limit": found["time_limit"],
            "single": {
                "ratio": r["against_ratio"],
                "pairs": r["against_pairs"],
                "peak": r["measured_peak"],
            },
        }
        for r in runs
        if r["against"] and r["against_ratio"] is not None
    ]


def _asked(run: dict[str, Any], points: dict[str, dict[str, Any]]) -> int | None:
    """The budget `run` was asked to plan for, as benchmarks.compiled's bench_model asks
    it from its point's peak (None for a torch.compile point). Not the JSON's budget: for
    a run that was infeasible, that is the least peak its planner reported instead."""
    if run["method"] == "pytorch":
        return None
    point_peak = points[run["against"]]["measured_peak"]
    return below_least_budget(point_peak) if run["setting"] == BELOW_LEAST else point_peak


def one_process(spec: dict[str, Any]) -> dict[str, Any]:
    """A case's run in this process (see the module): its ratio, pairs, peak and status."""
    model = spec["model"]
    example = ZOO[model](**sizes_of(model, spec["sizes"])).to(spec["device"])
    bench = Bench(example, spec["repeats"], spec["time_limit"])
    runner = Compiled(bench, spec["solver"], spec["time_limit"], spec["seconds"])
    runner.eager()
    if spec["budget"] is None:
        run = runner.pytorch(float(spec["against"]), against_itself=True)
    else:
        run = runner.memplan(spec["setting"], spec["budget"], against=spec["against"])
    return {
        "ratio": run.against_ratio,
        "pairs": run.against_pairs,
        "peak": run.measured_peak,
        "status": run.status,
    }


def in_fresh_process(spec: dict[str, Any]) -> dict[str, Any]:
    """one_process(spec) in a new Python process; a process that fails is recorded."""
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.across_processes", "--one", json.dumps(spec)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith(RESULT)]
    if done.returncode != 0 or not lines:
        return _failed((done.stderr.strip().splitlines() or ["no output"])[-1])
    return json.loads(lines[-1].removeprefix(RESULT))


def _failed(why: str) -> dict[str, Any]:
    """What a case's process that measured nothing records."""
    return {"ratio": None, "pairs": 0, "peak": None, "status": f"error: {why}"}


def median_ratio(case: dict[str, Any]) -> float | None:
    """The median ratio over the case's processes that measured one."""
    ratios = [p["ratio"] for p in case["processes"] if p["ratio"] is not None]
    return statistics.median(ratios) if ratios else None


def verdict(case: dict[str, Any]) -> str:
    """Whether the case meets its target on the median over processes: a matched run
    dominates its point (no higher peak in any process, within SLOWER_ALLOWED of its
    time); the run below torch.compile's least is LOWER_REQUIRED lower at no more time."""
    ratio = median_ratio(case)
    peaks = [p["peak"] for p in case["processes"]]
    if case["setting"] == FLOOR or ratio is None or None in peaks:
        return "-"
    if case["setting"] == BELOW_LEAST:
        return "met" if far_enough_below(max(peaks), case["point_peak"], ratio) else "missed"
    held = dominates(max(peaks), case["point_peak"], ratio)
    return "dominates" if held else "does not dominate"


def markdown(data: dict[str, Any]) -> str:
    """The device's part of docs/measurement.md's section on this benchmark (without its
    markers), under the section's own heading and text, which the page keeps."""
    where = data["machine"]
    lines = [
        f"### On {where['device_name']}",
        "",
        f"Written by `python -m benchmarks.across_processes` ({where['date']}, "
        f"{where['device_name']}, {where['cpu_threads']} threads, torch {where['torch']}); "
        f"the raw figures are in `benchmarks/results/across-processes-{where['device']}.json`."
        " Each run that `benchmarks.compiled` timed head to head, run again in "
        f"{_processes(data['processes'])}, each compiling both steps afresh and timing "
        f"{data['seconds']:g} s of alternating pairs (at least 11). Ratio: the median of "
        "memplan's step over its torch.compile point's (for the noise floor, the point's "
        "over a twin of itself); the verdict is on the median over the processes, the "
        "single-process column is benchmarks.compiled's own run of the case (docs/results.md).",
        "",
    ]
    for model, found in data["models"].items():
        lines += [
            f"#### {model}",
            "",
            f"Measured {', '.join(sorted({c['date'] for c in found['cases']}))}; the cases "
            "are from benchmarks.compiled's run of "
            f"{found['compiled_date']}.",
            "",
            "| run | budget | torch.compile point | its peak | peak per process "
            "| ratio per process | median | single process | verdict |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for case in found["cases"]:
            ratio = median_ratio(case)
            processes = case["processes"]
            single = case["single"]
            peaks = ", ".join(format_bytes(p["peak"]) if p["peak"] else "-" for p in processes)
            ratios = ", ".join(_ratio(p) for p in processes)
            budget = "-" if case["budget"] is None else format_bytes(case["budget"])
            lines.append(
                f"| {case['setting']} | {budget} | {case['against']} "
                f"| {format_bytes(case['point_peak'])} "
                f"| {peaks} | {ratios} | {'-' if ratio is None else f'x{ratio:.3f}'} "
                f"| x{single['ratio']:.3f} at {format_bytes(single['peak'])} "
                f"({single['pairs']} pairs) | {verdict(case)} |"
            )
        verdicts = [verdict(c) for c in found["cases"] if c["setting"].startswith("matched")]
        held = verdicts.count("dominates")
        lines += [
            "",
            f"- On the medians, memplan's matched runs dominate {held} of {len(verdicts)}.",
            "",
        ]
        failed = [p["status"] for c in found["cases"] for p in c["processes"] if p["ratio"] is None]
        if failed:
            lines += [*(f"- A process failed: {status}" for status in failed), ""]
    return "\n".join(lines) + "\n"


def _processes(count: int) -> str:
    return "1 fresh process" if count == 1 else f"{count} fresh processes"


def _ratio(process: dict[str, Any]) -> str:
    if process["ratio"] is None:
        return "failed"
    return f"x{process['ratio']:.3f} ({process['pairs']})"


def markers(device: str) -> tuple[str, str]:
    return (
        f"<!-- across processes {device}: start -->",
        f"<!-- across processes {device}: end -->",
    )


def write_report(data: dict[str, Any], outputs: Outputs) -> None:
    """The device's section of docs/measurement.md (or of --out's measurement.md)."""
    write_section(outputs.docs / PAGE, markdown(data), *markers(data["machine"]["device"]))


def _options(parser: argparse.ArgumentParser) -> None:
    add_device_option(parser)
    parser.add_argument("--models", nargs="+", choices=list(SIZES), default=["resnet50", "cnn"])
    parser.add_argument("--processes", type=int, default=PROCESSES, help="per case")
    parser.add_argument(
        "--seconds", type=float, default=SECONDS, help="of alternating pairs per process"
    )
    parser.add_argument(
        "--settings",
        nargs="+",
        default=None,
        # argparse formats help with %: the setting's own is escaped.
        help=f'only these cases, by setting ("matched 0.8", "{BELOW_LEAST.replace("%", "%%")}", '
        f'"{FLOOR}"); '
        "the model's other cases keep their earlier figures",
    )
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a case's process


def _chosen(case: dict[str, Any], settings: list[str] | None) -> bool:
    return settings is None or case["setting"] in settings


def run_cases(args: argparse.Namespace, where: dict[str, Any], path: Path) -> dict[str, Any]:
    """The chosen cases (`--settings`, else all) of every model, process by process; the
    JSON at `path` is rewritten after each process, and keeps the models and cases not
    rerun."""
    compiled = json.loads((RESULTS / f"compiled-{args.device}.json").read_text())
    data = json.loads(path.read_text()) if path.exists() else {"models": {}}
    data |= {"machine": where, "processes": args.processes, "seconds": args.seconds}
    for model in args.models:
        found = compiled["models"][model]
        earlier = {c["setting"]: c for c in data["models"].get(model, {}).get("cases", [])}
        fresh = [c | {"date": where["date"], "processes": []} for c in cases(compiled, model)]
        data["models"][model] = {
            "compiled_date": found["date"],
            "cases": [
                c if _chosen(c, args.settings) else earlier.get(c["setting"], c) for c in fresh
            ],
        }
    known = {c["setting"] for m in args.models for c in data["models"][m]["cases"]}
    unknown = sorted(set(args.settings or ()) - known)
    if unknown:  # before any process runs or the JSON is rewritten
        raise MemplanError(
            f"no head-to-head case {', '.join(map(repr, unknown))} in "
            f"{', '.join(args.models)}; the cases: {', '.join(sorted(known))}"
        )
    todo = [
        (m, c) for m in args.models for c in data["models"][m]["cases"] if _chosen(c, args.settings)
    ]
    with Progress() as progress:
        task = progress.add_task("fresh processes", total=len(todo) * args.processes)
        for _ in range(args.processes):
            for model, case in todo:
                progress.update(task, description=f"{model}: {case['setting']}")
                spec = {
                    "model": model,
                    "sizes": args.sizes,
                    "device": args.device,
                    "repeats": compiled["repeats"],
                    "solver": compiled["solver"],
                    "seconds": args.seconds,
                } | {k: case[k] for k in ("setting", "budget", "against", "time_limit")}
                case["processes"].append(in_fresh_process(spec))
                write_json_atomically(path, data)
                progress.advance(task)
    return data


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parsed = measurement_command_line(parser, argv, _options, "across-processes", write_report)
    if parsed is None:
        return
    args, outputs, where, path = parsed
    if args.one is not None:
        try:
            found = one_process(json.loads(args.one))
        except Exception as error:  # the parent records it as the process's status
            found = _failed(one_line(error))
        print(RESULT + json.dumps(found), flush=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    data = run_cases(args, where, path)
    write_report(data, outputs)
    print(f"wrote {path} and {outputs.docs / PAGE}")


if __name__ == "__main__":
    main()
