"""The one way memplan checks what it reads from JSON: plans, schedules and the
literature's node-link graphs.

A check takes a parsed JSON value and returns it as the reader holds it, or raises
Mismatch saying what the value must be ("must be a non-negative integer, got 1.5"); each
file format adds where the value sat and raises its own error type, one line. Values
are cut short in messages so that a damaged file never makes a page-long error. JSON
has no integer/float distinction that Python keeps: integer fields take ints that are not
bools (json reads true as True, an int) and refuse 1.0 rather than truncate it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeGuard

from memplan.core.errors import MemplanError

# A check: a JSON value -> the value as the reader holds it, or Mismatch.
Check = Callable[[object], Any]


class Mismatch(Exception):
    """A value is not of the kind its field holds; the message says what it must be."""


def is_int(value: object) -> TypeGuard[int]:
    """A JSON integer: an int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def shown(value: object, limit: int = 60) -> str:
    """repr(value), cut short so that an error about a long list stays one line."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def text(value: object) -> str:
    if not isinstance(value, str):
        raise Mismatch(f"must be a string, got {shown(value)}")
    return value


def integer(value: object) -> int:
    """Any JSON integer (a node id)."""
    if not is_int(value):
        raise Mismatch(f"must be an integer, got {shown(value)}")
    return value


def count(value: object) -> int:
    """Bytes or a step index: a non-negative JSON integer."""
    if not (is_int(value) and value >= 0):
        raise Mismatch(f"must be a non-negative integer, got {shown(value)}")
    return value


def seconds(value: object) -> float:
    """A time: a finite non-negative number (JSON writes 2.0 as 2.0, but people write 2)."""
    try:
        number = float(value) if is_int(value) or isinstance(value, float) else math.nan
    except OverflowError:  # an integer too large for a float
        number = math.inf
    if not (math.isfinite(number) and number >= 0):
        raise Mismatch(f"must be a finite non-negative number, got {shown(value)}")
    return number


def flag(value: object) -> bool:
    """A JSON boolean: "false" as a string is refused, not read as true."""
    if not isinstance(value, bool):
        raise Mismatch(f"must be true or false, got {shown(value)}")
    return value


def at_most(check: Check, limit: int, what: str) -> Check:
    """`check`, then refuse values above `limit` ("is over `what`")."""

    def bounded(value: object) -> Any:
        checked = check(value)
        if checked > limit:
            raise Mismatch(f"is over {what}")
        return checked

    return bounded


def one_of(choices: tuple[str, ...]) -> Check:
    """A string among `choices`."""
    names = ", ".join(choices[:-1]) + f" or {choices[-1]}" if len(choices) > 1 else choices[0]

    def check(value: object) -> str:
        if not (isinstance(value, str) and value in choices):
            raise Mismatch(f"must be one of {names}, got {shown(value)}")
        return value

    return check


def obj(value: object) -> dict[str, Any]:
    """A JSON object (its keys are strings by JSON's rules)."""
    if not (isinstance(value, dict) and all(isinstance(key, str) for key in value)):
        raise Mismatch(f"must be an object, got {shown(value)}")
    return value


def list_of(item: Check, what: str) -> Check:
    """A JSON list whose every item passes `item`; `what` names the items in messages."""

    def check(value: object) -> list[Any]:
        if not isinstance(value, list):
            raise Mismatch(f"must be a list of {what}, got {shown(value)}")
        out = []
        for index, entry in enumerate(value):
            try:
                out.append(item(entry))
            except Mismatch:
                raise Mismatch(
                    f"must be a list of {what}; item {index} is {shown(entry)}"
                ) from None
        return out

    return check


def names_to(item: Check, what: str) -> Check:
    """A JSON object from tensor names to values that pass `item`."""

    def check(value: object) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise Mismatch(f"must map tensor names to {what}, got {shown(value)}")
        out = {}
        for key, entry in value.items():
            try:
                out[text(key)] = item(entry)
            except Mismatch:
                raise Mismatch(
                    f"must map tensor names to {what}; {shown(key)} maps to {shown(entry)}"
                ) from None
        return out

    return check


def field(
    record: dict[str, Any], name: str, check: Check, error: Callable[[str], MemplanError]
) -> Any:
    """`record[name]` checked; `error(f"{name!r} {what it must be}")` otherwise."""
    try:
        return check(record[name])
    except Mismatch as mismatch:
        raise error(f"{name!r} {mismatch}") from None


def read_json(path: str | Path, error: type[MemplanError], what: str) -> object:
    """The parsed JSON of the file at `path`; `error` with one line saying why not (the
    file is missing or unreadable, not UTF-8, not JSON, or nested too deeply to be `what`)."""
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise error(f"{path}: cannot read: no such file") from None
    except OSError as oserror:
        raise error(f"{path}: cannot read: {oserror.strerror or oserror}") from oserror
    except ValueError as bad_path:  # a path with a NUL byte in it
        raise error(f"{path!r}: cannot read: {bad_path}") from bad_path
    try:
        decoded = raw.decode("utf-8")
    except UnicodeDecodeError as undecodable:
        raise error(
            f"{path}: not valid JSON (not UTF-8 text at byte {undecodable.start})"
        ) from None
    try:
        return json.loads(decoded)
    except json.JSONDecodeError as invalid:
        raise error(f"{path}: not valid JSON ({invalid.msg} at line {invalid.lineno})") from None
    except RecursionError:
        raise error(f"{path}: not {what} (JSON nested too deeply)") from None
