"""Writing output files atomically: a reader, or a run cut short, never sees half a file."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any


def write_atomically(
    path: str | Path, write: Callable[[IO[Any]], object], *, binary: bool = False
) -> None:
    """Call `write` on a temporary file next to `path`, then rename it over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "wb" if binary else "w") as out:
            write(out)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def write_json_atomically(path: str | Path, data: object) -> None:
    write_atomically(path, lambda out: json.dump(data, out, indent=1))
