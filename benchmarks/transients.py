"""`python -m benchmarks.transients`: kernels' own buffers on the zoo, and the estimates.

Each zoo model's joint graph is traced and profiled on this CPU; for every op the largest
transient measured (the allocator's peak while a node runs above what it leaves: see
memplan/planner/profile.py) is set against the conservative bound planner/roofline.py
uses where nothing is measured. Writes benchmarks/results/transients-<device>.json and the
section of docs/measurement.md between its markers. A bound below a measured transient
is a bug in the estimates: the run says so and exits with status 1.
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch
from rich.progress import track

from benchmarks.pages import saved_or_measured, write_section
from benchmarks.paths import DOCS, RESULTS, ROOT
from memplan.core.budget import Budget
from memplan.core.units import format_bytes
from memplan.planner.capture import compile_training_step
from memplan.planner.options import PlanOptions
from memplan.planner.partitioner import Partitioner
from memplan.planner.roofline import estimated_workspace
from memplan.tools.zoo import ZOO

PAGE = DOCS / "measurement.md"
START, END = "<!-- transients: start -->", "<!-- transients: end -->"


@dataclass(frozen=True)
class Row:
    """One op on the zoo: its largest measured transient and the bound at that node."""

    op: str
    nodes: int
    measured: int  # the most any node of this op held, in bytes
    model: str  # where that was
    bound: int  # the estimate at that node
    least_margin: int  # min over the op's nodes of bound - measured: negative is a bug


def rows(names: list[str]) -> list[Row]:
    """Every op with work to do in the named zoo models' joint graphs."""
    found: dict[str, list[tuple[int, int, str]]] = {}
    for name in track(names, description="profiling the zoo"):
        example = ZOO[name]()
        part = Partitioner(Budget.parse("100%"), PlanOptions(progress=False), name=name)
        compile_training_step(copy.deepcopy(example.model), example.inputs, part)
        lowered = part.lowered[0]
        for node, fx_node in zip(lowered.graph, lowered.fx_nodes, strict=True):
            if fx_node.op != "call_function" or not isinstance(
                fx_node.target, torch._ops.OpOverload
            ):
                continue
            found.setdefault(str(fx_node.target), []).append(
                (node.workspace, estimated_workspace(fx_node), name)
            )
    out = []
    for op, held in found.items():
        measured, bound, model = max(held)
        margin = min(b - m for m, b, _ in held)
        out.append(Row(op, len(held), measured, model, bound, margin))
    return sorted(out, key=lambda r: (-r.measured, r.op))


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"Written by `python -m benchmarks.transients` on {data['machine']}, from the zoo "
        f"models at their default sizes ({', '.join(data['models'])}). Every op with a "
        "transient is listed, largest first; `bound at it` is the estimate where that "
        "transient was measured, `least margin` the smallest bound minus measurement over "
        "all of the op's nodes (never negative).",
        "",
        "| op | nodes | largest transient | model | bound at it | least margin |",
        "|---|---|---|---|---|---|",
    ]
    for r in (Row(**r) for r in data["rows"]):
        if r.measured == 0:
            continue
        lines.append(
            f"| `{r.op}` | {r.nodes} | {format_bytes(r.measured)} | {r.model} | "
            f"{format_bytes(r.bound)} | {format_bytes(r.least_margin)} |"
        )
    quiet = sum(1 for r in data["rows"] if r.get("measured") == 0)
    lines += ["", f"The other {quiet} ops measured no transient at all.", ""]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(ZOO), default=sorted(ZOO))
    parser.add_argument("--report-only", action="store_true", help="rewrite the page from JSON")
    args = parser.parse_args(argv)
    device = "cpu"
    path = RESULTS / f"transients-{device}.json"

    def measure() -> dict[str, Any]:
        cpu = platform.processor() or platform.machine()
        machine = f"{cpu}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}"
        return {
            "machine": machine,
            "models": args.models,
            "rows": [asdict(r) for r in rows(args.models)],
        }

    data = saved_or_measured(path, args.report_only, measure)
    write_section(PAGE, markdown(data), START, END)
    broken = [r["op"] for r in data["rows"] if r["least_margin"] < 0]
    if broken:
        print(f"bounds below a measured transient: {', '.join(broken)}", file=sys.stderr)
        return 1
    print(f"wrote {path.relative_to(ROOT)} and {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
