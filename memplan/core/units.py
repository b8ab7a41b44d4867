"""Bytes and seconds as people read them: the one formatting every message and table uses."""

from __future__ import annotations


def format_bytes(n: float) -> str:
    """1536 -> '1.50 KiB'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


def format_seconds(seconds: float) -> str:
    """0.0123 -> '12.30 ms'."""
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.1f} µs"
