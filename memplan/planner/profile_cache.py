"""Measured op costs (time and transient memory) kept on disk, keyed by op, argument
signature and device.

Shared by every graph: a transformer's layers, and the next run's graph, hit the same keys.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import platform
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

import torch
from torch import fx

from memplan import compat
from memplan.core import checks, config
from memplan.planner.shapes import concrete, hint

# v2 entries are [seconds, transient bytes]; v1 files (seconds only) are left alone.
CACHE_FILE = "profile-v2.json"


class Cost(NamedTuple):
    """What running a node costs: its median seconds and its transient bytes (the
    allocator's peak while it runs above what it leaves allocated)."""

    seconds: float
    workspace: int


class ProfileCache:
    """A Cost per `node_key`, read from `path` on first use and rewritten whole on update;
    a key's first cost is its cost for good.

    A missing or corrupt file, or a corrupt entry, reads as empty: the cache is only ever a
    shortcut.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path if path is not None else config.cache_dir() / CACHE_FILE
        self._entries: dict[str, Cost] | None = None

    def get(self, key: str) -> Cost | None:
        return self._load().get(key)

    def update(self, costs: Mapping[str, Cost]) -> dict[str, Cost]:
        """Add `costs` and write the file atomically, so no reader sees half of it; return
        the cost the cache holds for each key of `costs`.

        The first cost written for a key stays: one measured again (another process
        profiling a graph that shares the key, or this one a graph that only partly hit)
        is dropped, so that every later plan in every process sees the times the first
        plan saw and decides the same. The file is read again under a lock first: another
        process (a test worker, a second training job) may have added entries since this
        one read it, and writing back only what this one knew would drop them."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_name(self.path.name + ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released as the file closes
            entries = {**costs, **(self._entries or {}), **_read(self.path)}
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(entries, f, sort_keys=True)
                os.replace(tmp, self.path)
            except BaseException:
                os.unlink(tmp)
                raise
        self._entries = entries
        return {key: entries[key] for key in costs}

    def _load(self) -> dict[str, Cost]:
        if self._entries is None:
            self._entries = _read(self.path)
        return self._entries


def node_key(node: fx.Node, device: torch.device) -> str:
    """sha256 of the node's op, its arguments' shapes, dtypes and strides, and the device."""
    args = fx.node.map_arg((node.args, node.kwargs), lambda n: _signature(n.meta.get("val")))
    text = f"{_target_name(node.target)}|{args!r}|{device.type}|{device_name(device)}"
    return hashlib.sha256(text.encode()).hexdigest()


def device_name(device: torch.device) -> str:
    """What a time measured on `device` depends on: the GPU model, or the CPU and its threads."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return f"{platform.processor() or platform.machine()} x{torch.get_num_threads()}"
    return device.type


def _read(path: Path) -> dict[str, Cost]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    entries = {}
    for key, value in data.items():
        try:
            entries[key] = Cost(checks.seconds(value[0]), checks.count(value[1]))
        except (checks.Mismatch, TypeError, IndexError, KeyError):
            continue
    return entries


def _signature(val: object) -> object:
    if isinstance(val, torch.Tensor):
        shape, stride = tuple(map(hint, val.shape)), tuple(map(hint, val.stride()))
        return ("tensor", shape, val.dtype, stride)
    if isinstance(val, list | tuple):
        return tuple(_signature(v) for v in val)
    return concrete(val)


def _target_name(target: object) -> str:
    # Not repr(): a plain function's repr holds its address, which changes every run.
    if compat.is_op_overload(target):
        return str(target)
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', target)}"
