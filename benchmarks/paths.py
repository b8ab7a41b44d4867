"""Where the benchmarks read and write: the repository's root, the JSON of their figures
(benchmarks/results/) and the docs they draw (docs/)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOCS = ROOT / "docs"
