"""Writing output files atomically: a reader, or a run cut short, never sees half a file."""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from memplan.core.errors import OutputFileError


def write_atomically(
    path: str | Path, write: Callable[[IO[Any]], object], *, binary: bool = False
) -> None:
    """Call `write` on a temporary file next to `path`, then rename it over `path`."""

    def fill(temporary: Path) -> None:
        with open(temporary, "wb" if binary else "w") as out:
            write(out)

    write_together([(path, fill)])


def write_json_atomically(path: str | Path, data: object) -> None:
    write_atomically(path, lambda out: json.dump(data, out, indent=1))


def write_together(outputs: Sequence[tuple[str | Path, Callable[[Path], object]]]) -> None:
    """Write several files so that an error leaves every one of them as it was.

    Each `write(temporary)` writes its file at a temporary path next to its output; only
    once all of them succeeded are they renamed into place. On any error the temporary
    files, and the folders made for them, are removed; an OSError becomes an
    OutputFileError naming the output. (A rename can still fail half way, where the file
    system refuses one after another succeeded; outputs that are folders, the likely
    cause, are refused before any rename.)
    """
    created: list[Path] = []
    staged: list[tuple[Path, Path]] = []
    path = Path()
    try:
        for target, write in outputs:
            path = Path(target)
            if not path.name:  # "." or "/": a folder, and no name to put next to it
                raise IsADirectoryError(21, "Is a directory", str(path))
            created += _make_folders(path.parent)
            temporary = _new_file(path)
            staged.append((temporary, path))
            write(temporary)
        for _, path in staged:
            if path.is_dir():
                raise IsADirectoryError(21, "Is a directory", str(path))
        for temporary, path in staged:
            os.replace(temporary, path)
    except BaseException as error:
        for temporary, _ in staged:
            temporary.unlink(missing_ok=True)
        for folder in reversed(created):
            try:
                folder.rmdir()
            except OSError:  # no longer empty: something else wrote there meanwhile
                break
        if isinstance(error, OSError):
            reason = error.strerror or str(error)
            raise OutputFileError(f"{path}: cannot write: {reason}") from error
        raise


def _make_folders(folder: Path) -> list[Path]:
    """Make `folder` and its missing parents; the ones made, outermost first."""
    missing = []
    while not folder.exists() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    missing.reverse()
    for each in missing:
        each.mkdir()
    return missing


def _new_file(path: Path) -> Path:
    """A new, empty file next to `path` with a name no one else uses.

    Not tempfile.mkstemp: its files are private (0600), and the output would keep that
    mode; os.open with 0o666 gives the mode the umask gives any new file.
    """
    while True:
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}.part")
        try:
            os.close(os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return temporary
