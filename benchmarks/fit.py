"""`python -m benchmarks.fit`: will it fit? Real-size configs planned on fake tensors.

Each case plans one transformers config's whole training step (AdamW state, fp32 master
copies in bf16) for an H100 with `memplan plan --hf-config`'s code path, in a process of
its own, so that its wall time and peak resident memory (ru_maxrss) are the case's alone.
GPT-2 small also runs for real on this CPU: the fake-tensor plan's decisions are applied
to the real model and the allocator's peak of one planned step is set against the
prediction. Writes benchmarks/results/fit-cpu.json and the section of docs/fit.md between
its markers.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rich.progress import track

import memplan
from benchmarks.layout import machine
from benchmarks.pages import write_section
from benchmarks.paths import DOCS, RESULTS, ROOT
from memplan.core.budget import Budget
from memplan.core.devices import target
from memplan.core.errors import MemplanWarning
from memplan.core.files import write_json_atomically
from memplan.core.units import format_bytes
from memplan.planner.options import PlanOptions
from memplan.tools.fake_model import causal_lm
from memplan.tools.fit import fit
from memplan.tools.verify import verify

CONFIGS = ROOT / "benchmarks" / "configs"
PAGE = DOCS / "fit.md"
START, END = "<!-- fit: start -->", "<!-- fit: end -->"


@dataclass(frozen=True)
class Case:
    """One config at one size, dtype, budget and rank count, planned for an H100."""

    name: str
    config: str
    batch: int
    seq: int
    dtype: str
    budget: str
    ranks: int = 1


CASES = {
    c.name: c
    for c in (
        Case("gpt2-small", "gpt2-small.json", 2, 512, "fp32", "80GB"),
        Case("gpt2-small @ 75%", "gpt2-small.json", 2, 512, "fp32", "75%"),
        Case("llama-1b", "llama-1b.json", 1, 4096, "bf16", "80GB"),
        Case("llama-1b @ 32GB", "llama-1b.json", 1, 4096, "bf16", "32GB"),
        Case("llama-1b @ 28GB", "llama-1b.json", 1, 4096, "bf16", "28GB"),
        Case("llama-8b", "llama-8b.json", 1, 4096, "bf16", "80GB"),
        Case("llama-8b, 8 ranks", "llama-8b.json", 1, 4096, "bf16", "80GB", ranks=8),
        Case("llama-8b, 8 ranks @ 40GB", "llama-8b.json", 1, 4096, "bf16", "40GB", ranks=8),
    )
}


def run_case(case: Case) -> dict[str, Any]:
    """Plan `case` in this process; its figures, wall time and peak resident memory."""
    started = time.perf_counter()
    options = PlanOptions(
        measure=False, device_spec=target("h100"), progress=False, offload=True,
        bandwidth=target("h100").host_to_device,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemplanWarning)  # every time is a roofline estimate
        example = causal_lm(CONFIGS / case.config, batch=case.batch, seq=case.seq, dtype=case.dtype)
        found = fit(example, Budget.parse(case.budget), options, ranks=case.ranks)
    seconds = time.perf_counter() - started
    plan = found.plan
    return {
        **asdict(case),
        "parameters": found.state.parameters,
        "seconds": seconds,
        "max_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "budget_bytes": found.budget,
        "fits": found.fits,
        "bound": found.bound,
        "least": found.least,
        "unplanned": found.unplanned.parts(),
        "planned": found.planned.parts() if found.planned else None,
        "unplanned_peak": found.unplanned.total,
        "predicted_peak": found.planned.total if found.planned else None,
        "overhead": plan.overhead if plan else None,
        "predicted_time": plan.predicted_time if plan else None,
        "solver": plan.solver if plan else None,
        "dominant": found.dominant()[0],
    }


def real_check() -> dict[str, Any]:
    """GPT-2 small at 2 x 512 in fp32: the fake-tensor plan at 60% of the graph's peak,
    applied to the same model built for real; predicted against the allocator's peak of a
    planned step."""
    path = CONFIGS / "gpt2-small.json"
    options = {"measure": False, "device_spec": target("h100"), "progress": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemplanWarning)
        fake = causal_lm(path, batch=2, seq=512)
        planned = memplan.plan(fake.model, fake.inputs, "60%", **options)
        real = causal_lm(path, batch=2, seq=512, fake=False)
        applied = memplan.plan(real.model, real.inputs, "60%", reuse=planned, **options)
        check = verify(real.model, real.inputs, applied)
    return {
        "fake_predicted_peak": planned.predicted_peak,
        "real_predicted_peak": applied.predicted_peak,
        "allocator_peak": check.measured_peak,
        "error": check.measured_peak / planned.predicted_peak - 1,
        "grads_match": check.grads_match,
    }


def page(results: dict[str, Any]) -> str:
    """The markdown section of docs/fit.md."""
    where = results["machine"]
    lines = [
        f"Measured on {where['cpu']} ({where['cpu_cores']} cores), torch {where['torch']}, "
        f"{where['date']}, by `python -m benchmarks.fit`; each case in a fresh process, "
        "planned for an H100 (roofline times) with AdamW; bf16 adds fp32 master weights "
        "and grads. A share is of the whole step's unplanned peak. Wall time is the whole "
        "command's work: building the model on fake tensors, tracing, planning.",
        "",
        "| case | parameters | batch x seq, dtype | budget | fits | unplanned peak "
        "| planned peak | overhead | largest part | wall time | max RSS |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in results["cases"]:
        planned = format_bytes(row["predicted_peak"]) if row["fits"] else (
            f"≥ {format_bytes(row['bound'])} (proved)" if row["least"] is None
            else f"least found {format_bytes(row['least'])}"
        )  # fmt: skip
        overhead = f"{row['overhead']:+.1%}" if row["overhead"] is not None else "-"
        lines.append(
            f"| {row['name']} | {row['parameters'] / 1e9:.2f} B "
            f"| {row['batch']} x {row['seq']}, {row['dtype']} | {row['budget']} "
            f"| {'yes' if row['fits'] else 'no'} | {format_bytes(row['unplanned_peak'])} "
            f"| {planned} | {overhead} | {row['dominant']} | {row['seconds']:.1f} s "
            f"| {format_bytes(row['max_rss'])} |"
        )
    lines += ["", "The unplanned peak of each case, by part:", ""]
    parts = list(results["cases"][0]["unplanned"])
    lines.append("| case | " + " | ".join(parts) + " |")
    lines.append("|---" * (len(parts) + 1) + "|")
    for row in results["cases"]:
        cells = " | ".join(format_bytes(row["unplanned"][p]) for p in parts)
        lines.append(f"| {row['name']} | {cells} |")
    real = results.get("real")
    if real:
        lines += [
            "",
            "GPT-2 small at 2 x 512 in fp32 on this CPU, its fake-tensor plan at 60% applied "
            f"to the real model: predicted {format_bytes(real['fake_predicted_peak'])} on fake "
            f"tensors, {format_bytes(real['real_predicted_peak'])} on the real model; the "
            f"allocator's peak of a planned step {format_bytes(real['allocator_peak'])} "
            f"({real['allocator_peak'] - real['fake_predicted_peak']:+d} B, "
            f"{real['error']:+.3%}); gradients equal to eager's: "
            f"{'yes' if real['grads_match'] else 'no'}. The graph's peak alone: a training "
            "step run here holds no optimizer state.",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one, in-process
    parser.add_argument("--no-real", dest="real", action="store_false")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.case:
        print(json.dumps(run_case(CASES[args.case])))
        return 0
    rows = []
    for name in track(args.cases, description="planning the configs"):
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.fit", "--case", name],
            capture_output=True, text=True, check=True, cwd=ROOT,
        )  # fmt: skip
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    results = {"machine": machine(), "cases": rows, "real": real_check() if args.real else None}
    write_json_atomically(args.out / "fit-cpu.json", results)
    write_section(PAGE, page(results), START, END)
    for row in rows:
        print(row["name"], "fits" if row["fits"] else "does not fit", f"{row['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
