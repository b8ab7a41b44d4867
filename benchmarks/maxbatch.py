"""The largest batch under a memory cap (memplan.tools.maxbatch) for GPT-2 and ResNet-50.

Each model's cap is the eager peak at REFERENCE_BATCH, measured here (rounded up to a
whole MiB), so that eager's largest batch is about REFERENCE_BATCH and the others' are
read against it. Writes benchmarks/results/maxbatch-<device>.json and docs/maxbatch.md.
Run: `python -m benchmarks.maxbatch [--help]`.
"""

from __future__ import annotations

import argparse
import functools
import json
import warnings
from typing import Any

import torch
from rich.console import Console

from benchmarks.models import SIZES, machine
from benchmarks.paths import DOCS, RESULTS
from memplan.core.units import format_bytes
from memplan.tools.maxbatch import DEFAULT_OVERHEAD, METHODS, MaxBatch, Probe, max_batch
from memplan.tools.verify import steady_step_peak
from memplan.tools.zoo import ZOO

MODELS = ("gpt2", "resnet50")
REFERENCE_BATCH = 8
TARGET = 2.5  # memplan's largest batch against eager's


def build(name: str, batch: int) -> tuple[torch.nn.Module, tuple[Any, ...]]:
    sizes = {k: v for k, v in SIZES[name].items() if k != "batch"}
    example = ZOO[name](batch=batch, **sizes)
    return example.model, example.inputs


def cap_for(name: str) -> int:
    """The eager peak at REFERENCE_BATCH, rounded up to a whole MiB."""
    model, inputs = build(name, REFERENCE_BATCH)
    peak = steady_step_peak(model, model, inputs)
    return -(-peak // 2**20) * 2**20


def markdown(found: dict[str, list[MaxBatch]], where: dict[str, Any], overhead: float) -> str:
    lines = [
        "# Largest batch under a memory cap",
        "",
        "Written by `python -m benchmarks.maxbatch`; raw figures in "
        f"`benchmarks/results/maxbatch-{where['device']}.json`. Do not edit by hand.",
        "",
        f"Machine: {where['device_name']} ({where['device']}), {where['cpu_threads']} CPU "
        f"threads, torch {where['torch']}, {where['date']}.",
        "",
        f"`memplan maxbatch` (memplan/tools/maxbatch.py) with a step-time overhead limit of "
        f"{overhead:.0%} per sample against eager's time per sample at eager's largest batch. "
        "The cap is enforced: on CPU a step whose allocator peak (kernels' own buffers "
        "included) passes it counts as out of memory; on CUDA the caching allocator's "
        "per-process fraction limits it. Each model's cap is the eager peak at batch "
        f"{REFERENCE_BATCH}, at the sizes of the head-to-head benchmark. PyTorch's partitioner "
        "is tried at every activation memory budget and its fastest fitting one kept. The "
        "search finds the largest batch that runs under the cap, then the largest within "
        "the overhead limit below it (time per sample falls with the batch until the cap "
        "forces recomputation, so a batch too slow at eager's size may fit higher up). "
        f"Target: memplan at least {TARGET}x eager's largest batch.",
        "",
        "`under the cap alone`: the largest batch seen to run under the cap at any speed "
        "(the search's probes; a lower bound where the search stopped early).",
        "",
        "| model | cap | method | largest batch | vs eager | step time | setting "
        "| under the cap alone |",
        "|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for name, results in found.items():
        eager = next(r.batch for r in results if r.method == "eager")
        for r in results:
            ratio = f"{r.batch / eager:.2f}x" if eager else "-"
            seconds = "-" if r.step_seconds is None else f"{r.step_seconds * 1e3:.0f} ms"
            ran = max((p.batch for p in r.probes if p.step_seconds is not None), default=0)
            lines.append(
                f"| {name} | {format_bytes(r.cap_bytes)} | {r.method} | {r.batch} | {ratio} | "
                f"{seconds} | {r.setting or '-'} | {ran} |"
            )
        planned = next((r.batch for r in results if r.method == "memplan"), None)
        if planned is not None and eager:
            verdict = "met" if planned >= TARGET * eager else "missed"
            verdicts.append(
                f"- {name}: memplan {planned / eager:.2f}x eager's batch; target {verdict}."
            )
    return "\n".join([*lines, "", *verdicts, ""])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    parser.add_argument("--overhead", type=float, default=DEFAULT_OVERHEAD)
    parser.add_argument("--solver", default="greedy", help="memplan's solver")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="rewrite docs/maxbatch.md from this machine's JSON without measuring",
    )
    args = parser.parse_args(argv)
    console = Console()
    if args.report_only:
        out = RESULTS / f"maxbatch-{machine()['device']}.json"
        saved = json.loads(out.read_text())
        found = {name: [MaxBatch.from_json(r) for r in rs] for name, rs in saved["results"].items()}
        overhead = saved.get("overhead", args.overhead)
        (DOCS / "maxbatch.md").write_text(markdown(found, saved["machine"], overhead))
        console.print(f"wrote {DOCS / 'maxbatch.md'} from {out}")
        return
    warnings.filterwarnings("ignore", category=UserWarning)
    found: dict[str, list[MaxBatch]] = {}
    for name in args.models:
        cap = cap_for(name)
        console.print(f"{name}: cap {format_bytes(cap)} (eager peak at batch {REFERENCE_BATCH})")

        def report(method: str, probe: Probe, name: str = name) -> None:
            verdict = "fits" if probe.fits else f"no: {probe.reason[:90]}"
            console.print(f"  {name} {method} batch {probe.batch}: {verdict}")

        found[name] = max_batch(
            functools.partial(build, name),
            cap,
            args.methods,
            overhead=args.overhead,
            solver=args.solver,
            on_probe=report,
        )
    where = machine()
    out = RESULTS / f"maxbatch-{where['device']}.json"
    results = {name: [r.to_json() for r in rs] for name, rs in found.items()}
    saved = {"machine": where, "overhead": args.overhead, "results": results}
    out.write_text(json.dumps(saved, indent=1))
    (DOCS / "maxbatch.md").write_text(markdown(found, where, args.overhead))
    console.print(f"wrote {out} and {DOCS / 'maxbatch.md'}")


if __name__ == "__main__":
    main()
