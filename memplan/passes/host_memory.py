"""Which storages are host memory: the copies memplan's offload op makes.

Where the device is the host (CPU), an offload's copy lives in the same memory as the
step's tensors, but it stands for memory off the device: the measurement's live-storage
tracker (planner/measure.py) asks here and does not count it.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterator

import torch

# Storages memplan's offload op put in host memory. Weak, so marking never extends a life.
_HOST_STORAGES: weakref.WeakSet[torch.UntypedStorage] = weakref.WeakSet()
# Per thread: only the thread making an offload's copy is inside `host_allocations()`.
_host_scope = threading.local()


@contextlib.contextmanager
def host_allocations() -> Iterator[None]:
    """Storages ops return inside this block are host memory (an offload's copy)."""
    _host_scope.depth = getattr(_host_scope, "depth", 0) + 1
    try:
        yield
    finally:
        _host_scope.depth -= 1


def in_host_scope() -> bool:
    """Whether this thread is inside `host_allocations()`."""
    return bool(getattr(_host_scope, "depth", 0))


def add_host_storage(storage: torch.UntypedStorage) -> None:
    _HOST_STORAGES.add(storage)


def is_host_storage(storage: torch.UntypedStorage) -> bool:
    return storage in _HOST_STORAGES
