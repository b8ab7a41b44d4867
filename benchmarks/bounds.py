"""`python -m benchmarks.bounds`: the peak lower bound (memplan/solvers/bounds.py) on every
bundled graph, against the reference peak and the least peak any solver found in the
solver benchmark's last run (benchmarks/results/solvers.json).

A budget below the bound is proved infeasible; the rest of the gap between the bound and
the least peak found is what no one knows yet. Writes benchmarks/results/bounds.json and
the bounds section of docs/solvers.md.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path
from typing import Any

from benchmarks.pages import write_section
from benchmarks.paths import DOCS, RESULTS
from benchmarks.solvers import GRAPHS, SHARES
from memplan.core import remat
from memplan.core.files import write_json_atomically
from memplan.core.node_link import load_node_link
from memplan.solvers.bounds import peak_lower_bound

SOLVED = RESULTS / "solvers.json"
PAGE = DOCS / "solvers.md"
MARKERS = ("<!-- bounds: written by benchmarks/bounds.py -->", "<!-- bounds end -->")


def least_peaks() -> dict[tuple[str, str], int]:
    """Per (graph file, share), the least peak of any solver's schedule in solvers.json."""
    if not SOLVED.exists():
        return {}
    least: dict[tuple[str, str], int] = {}
    for row in json.loads(SOLVED.read_text())["rows"]:
        if row["peak"] is not None:
            key = (row["file"], row["share"])
            least[key] = min(row["peak"], least.get(key, row["peak"]))
    return least


def bound_row(path: Path, found: dict[tuple[str, str], int]) -> dict[str, Any]:
    graph = load_node_link(path)
    started = time.perf_counter()
    bound = peak_lower_bound(graph)
    seconds = time.perf_counter() - started
    shares = {}
    for share in SHARES:
        budget = remat.resolve_budget(graph, share)
        shares[share] = {
            "budget": budget,
            "proved_infeasible": bound > budget,
            "least_found": found.get((path.stem, share)),
        }
    return {
        "graph": path.stem,
        "nodes": len(graph),
        "reference_peak": remat.reference(graph).peak,
        "node_bound": peak_lower_bound(graph, depth=0),
        "bound": bound,
        "seconds": seconds,
        "shares": shares,
    }


def section(results: dict[str, Any]) -> str:
    machine = results["machine"]
    lines = [
        "## Lower bounds",
        "",
        f"`python -m benchmarks.bounds` ({machine['date']}, {machine['cpu']}): the peak no "
        "schedule can go below, as a share of the reference peak, with one node's inputs and "
        "output alone (depth 0) and looking two computations back (the bound). A budget share "
        "below the bound is proved infeasible. The last column is the least peak of any "
        "solver's schedule at that budget in the last solver benchmark (a solver stops once "
        "within its budget, so this is the least peak only where the budget was missed): "
        "between it and the bound lies what is still unknown.",
        "",
        "| graph | nodes | depth 0 | bound | seconds | proved infeasible | least peak of "
        "the solvers at 0.9 / 0.8 / 0.7 |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        reference = row["reference_peak"]
        proved = [s for s, v in row["shares"].items() if v["proved_infeasible"]]
        found = [v["least_found"] for v in row["shares"].values()]
        shown = " / ".join("-" if f is None else f"{f / reference:.3f}" for f in found)
        lines.append(
            f"| {row['graph']} | {row['nodes']} | {row['node_bound'] / reference:.3f} | "
            f"{row['bound'] / reference:.3f} | {row['seconds']:.2f} | "
            f"{', '.join(proved) or '-'} | {shown} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    found = least_peaks()
    rows = [bound_row(path, found) for path in sorted(GRAPHS.glob("*.json"))]
    machine = {"cpu": platform.machine(), "date": time.strftime("%Y-%m-%d")}
    results = {"machine": machine, "rows": rows}
    write_json_atomically(RESULTS / "bounds.json", results)
    write_section(PAGE, section(results), *MARKERS)
    print(section(results))


if __name__ == "__main__":
    main()
