"""What the `memplan` command's subcommands share: argument types that argparse checks,
and writing output files all or none, checked before any work is done. No torch here."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

from memplan.core.errors import OutputFileError
from memplan.core.files import write_together
from memplan.planner.plan_file import Plan
from memplan.tools.report import plot_timeline

EXIT_ERROR = 2
EXIT_CHECK_FAILED = 1


def write_all(outputs: list[tuple[Path, Callable[[Path], object]]], console: Console) -> None:
    """Write every (path, writer) or none (files.write_together), then say what was written."""
    write_together(outputs)
    for path, _ in outputs:
        console.print(f"wrote {path}", soft_wrap=True)  # a path is not wrapped


def write_plan(
    plan: Plan, output: Path, png: Path | None, console: Console, measured_peak: int | None = None
) -> None:
    """The plan's JSON at `output` and, where `png` is given, its memory timeline plot
    (with the measured peak where known): both files or neither, so that an error in the
    plot leaves no plan behind, nor the reverse."""
    outputs: list[tuple[Path, Callable[[Path], object]]] = [(output, plan.save)]
    if png is not None:
        outputs.append((png, lambda at: plot_timeline(plan, at, measured_peak=measured_peak)))
    write_all(outputs, console)


def check_outputs(inputs: Sequence[Path], outputs: Sequence[Path | None]) -> None:
    """OutputFileError, before any work is done, where an output (None: not asked for)
    cannot become a file: a folder, a path under a file, one of the inputs or another
    output. Other failures to write (permissions, a full disk) surface when writing."""
    named = [path for path in outputs if path is not None]
    for index, path in enumerate(named):
        if path.is_dir() or not path.name:
            raise OutputFileError(f"{path}: is a folder; name a file to write")
        folder = path.parent
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        if not folder.is_dir():
            raise OutputFileError(f"{path}: cannot write under {folder}, which is not a folder")
        for other in [*inputs, *named[:index]]:
            if _same_file(path, other):
                raise OutputFileError(f"{path}: would overwrite {other}; name another file")


def _same_file(one: Path, other: Path) -> bool:
    if one.exists() and other.exists():
        return os.path.samefile(one, other)
    return one.resolve() == other.resolve()


def number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def positive_float(text: str) -> float:
    value = number(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    value = number(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


def positive_int(text: str) -> int:
    value = non_negative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be 1 or more, got 0")
    return value


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value
