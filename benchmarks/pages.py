"""Writing a benchmark's section of a docs page: the text between two marker lines, which
a rerun replaces and the rest of the page keeps; the line naming the day of each model's
run; and the command line of a benchmark that writes one JSON and one such section
(`section_benchmark`, or `ResultsSection` for one of docs/results.md)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.paths import DOCS, RESULTS
from memplan.core.files import write_json_atomically

RESULTS_PAGE = DOCS / "results.md"


def write_section(page: Path, text: str, start: str, end: str) -> None:
    """Put `text` between the page's `start` and `end` markers (appending them the first
    time)."""
    content = page.read_text() if page.exists() else ""
    if start in content and end in content:
        before, rest = content.split(start, 1)
        after = rest.split(end, 1)[1]
    else:
        before, after = content.rstrip("\n") + "\n\n", "\n"
    page.write_text(f"{before}{start}\n{text}{end}{after}")


def saved_section(
    path: Path, text: Callable[[dict[str, Any]], str], start: str, end: str
) -> list[str]:
    """The section's lines, its `start` and `end` markers included and a blank line after,
    with `text` of the results saved at `path`; none where that JSON is not there (the
    benchmark has not run)."""
    if not path.exists():
        return []
    return [start, *text(json.loads(path.read_text())).splitlines(), end, ""]


def measured_on(dates: dict[str, str]) -> list[str]:
    """A line naming the day each model was measured, then a blank line, where the models
    come from runs of different days (a benchmark rerun on some models keeps the rest);
    none where they share one."""
    if len(set(dates.values())) <= 1:
        return []
    taken = ", ".join(f"{name} {date}" for name, date in dates.items())
    return [f"The models were measured in different runs, of the code of that day: {taken}.", ""]


def saved_or_measured(
    path: Path, report_only: bool, measure: Callable[[], dict[str, Any]]
) -> dict[str, Any]:
    """A benchmark's results: those saved at `path` where only its report is redrawn
    (--report-only), else `measure()`'s, saved there first."""
    if report_only:
        return json.loads(path.read_text())
    data = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(path, data)
    return data


def section_benchmark(
    argv: list[str] | None,
    description: str,
    path: Path,
    page: Path,
    markers: tuple[str, str],
    measure: Callable[[], dict[str, Any]],
    markdown: Callable[[dict[str, Any]], str],
) -> int:
    """The command line of a benchmark that writes one JSON (`path`) and one section of a
    page (between `markers`), with --report-only to redraw the section from the JSON."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--report-only", action="store_true", help="rewrite the page from JSON")
    args = parser.parse_args(argv)
    data = saved_or_measured(path, args.report_only, measure)
    write_section(page, markdown(data), *markers)
    print(f"wrote {path} and {page}")
    return 0


@dataclass(frozen=True)
class ResultsSection:
    """A benchmark measured on the CPU that saves its figures as
    benchmarks/results/<name, dashed>-<device>.json and writes them as one section of
    docs/results.md, between the markers `<!-- name: start -->` and `<!-- name: end -->`:
    its command line (`main`), and the section as the page's whole rewrite takes it
    (`saved`, from benchmarks.models' results_markdown)."""

    name: str  # "graph breaks"
    description: str  # the command line's, the first line of the module's docstring
    measure: Callable[[], dict[str, Any]]
    markdown: Callable[[dict[str, Any]], str]

    @property
    def markers(self) -> tuple[str, str]:
        return f"<!-- {self.name}: start -->", f"<!-- {self.name}: end -->"

    def path(self, device: str) -> Path:
        """Where the figures taken on `device` ("cpu", "cuda") are saved."""
        return RESULTS / f"{self.name.replace(' ', '-')}-{device}.json"

    def saved(self, where: dict[str, Any]) -> list[str]:
        """The section's lines with its markers, where the benchmark has run on `where`'s
        device (benchmarks.models.machine); none where it has not."""
        return saved_section(self.path(where["device"]), self.markdown, *self.markers)

    def main(self, argv: list[str] | None = None) -> int:
        path, page = self.path("cpu"), RESULTS_PAGE
        return section_benchmark(
            argv, self.description, path, page, self.markers, self.measure, self.markdown
        )
