"""Which storages are host memory: the copies memplan's offload op makes.

Where the device is the host (CPU), an offload's copy lives in the same memory as the
step's tensors, but it stands for memory off the device: the offload op marks its copy
here, and the measurement's live-storage tracker (planner/measure.py) asks here and does
not count it.
"""

from __future__ import annotations

import weakref

import torch

# Storages memplan's offload op put in host memory. Weak, so marking never extends a life.
_HOST_STORAGES: weakref.WeakSet[torch.UntypedStorage] = weakref.WeakSet()


def add_host_storage(storage: torch.UntypedStorage) -> None:
    _HOST_STORAGES.add(storage)


def is_host_storage(storage: torch.UntypedStorage) -> bool:
    return storage in _HOST_STORAGES
