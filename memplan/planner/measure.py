"""The real peak memory and wall time of one training step, read three ways.

The figures the simulator's predictions are checked against (see docs: Measurement).
"""

from __future__ import annotations

import contextlib
import statistics
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from memplan import compat
from memplan.core.collector import collector_paused
from memplan.passes.host_memory import add_host_storage, is_host_storage
from memplan.planner.allocator import recording
from memplan.planner.granularity import allocated_bytes

# Live trackers, so that marking a storage host-resident after it was counted uncounts it.
_TRACKERS: weakref.WeakSet[LiveStorageTracker] = weakref.WeakSet()


def mark_host(t: torch.Tensor) -> None:
    """Record that `t`'s storage is host memory (an offloaded copy): trackers do not count
    it."""
    storage = t.untyped_storage()
    add_host_storage(storage)
    for tracker in list(_TRACKERS):
        tracker.forget(storage)


class LiveStorageTracker(compat.TorchDispatchMode):
    """Bytes of live storages on `device`: the resident ones plus every new one an op returns.

    `current` drops when a storage dies (a weakref callback: torch keeps a storage's Python
    object alive as long as the storage, so the callback fires exactly at the free). It
    counts op outputs only; scratch buffers a kernel allocates and frees inside itself are
    invisible here, which the "allocator" method does see.
    """

    def __init__(
        self,
        resident: Iterable[torch.Tensor] = (),
        *,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.current = 0
        self.peak = 0
        # Keyed by id(storage): stable while the storage lives, and the callback drops the
        # entry before the id can be reused.
        self._live: dict[int, tuple[weakref.ref[torch.UntypedStorage], int]] = {}
        # Callbacks run on whichever thread drops the last reference (autograd's device
        # threads too), possibly while this thread is inside `_track`: hence re-entrant.
        self._lock = threading.RLock()
        for t in _dense_tensors(resident):
            self._track(t.untyped_storage())
        _TRACKERS.add(self)

    def __torch_dispatch__(
        self,
        func: compat.OpOverload,
        types: Sequence[type],
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        # An output sharing an input's storage (a view, an in-place op) allocated nothing,
        # even when that input predates the tracker and was never counted.
        inputs = {id(t.untyped_storage()) for t in _dense_tensors((args, kwargs))}
        for t in _dense_tensors(out):
            storage = t.untyped_storage()
            if id(storage) not in inputs:
                self._track(storage)
        return out

    def forget(self, storage: torch.UntypedStorage) -> None:
        """Stop counting `storage` (it turned out to be host memory)."""
        with self._lock:
            # Dropping the weakref also drops its callback, so the free is not subtracted twice.
            entry = self._live.pop(id(storage), None)
            if entry is not None:
                self.current -= entry[1]

    def _track(self, storage: torch.UntypedStorage) -> None:
        """Count `storage` if it is new, on the tracked device and not host memory."""
        if not _on(storage.device, self.device) or is_host_storage(storage):
            return
        with self._lock:
            key = id(storage)
            if key in self._live:
                return
            nbytes = allocated_bytes(storage.nbytes(), storage.device)
            self._live[key] = (weakref.ref(storage, partial(self._release, key)), nbytes)
            self.current += nbytes
            self.peak = max(self.peak, self.current)

    def _release(self, key: int, _ref: weakref.ref[torch.UntypedStorage]) -> None:
        with self._lock:
            entry = self._live.pop(key, None)
            if entry is not None:
                self.current -= entry[1]


@contextlib.contextmanager
def own_random_numbers(device: torch.device) -> Iterator[Callable[[int], None]]:
    """The host's generator and `device`'s (where it is a GPU) forked for memplan's own
    runs: the user's random numbers afterwards are those before. Yields a function that
    seeds those two generators and no other: torch.manual_seed would reset every GPU's,
    forked or not, and leave them so."""
    gpus: list[int] = []  # the one GPU forked and seeded, if any
    if device.type == "cuda":
        gpus.append(torch.cuda.current_device() if device.index is None else device.index)

    def seed(value: int) -> None:
        torch.random.default_generator.manual_seed(value)
        for index in gpus:
            torch.cuda.default_generators[index].manual_seed(value)

    with torch.random.fork_rng(devices=gpus):
        yield seed


@dataclass(frozen=True)
class Measurement:
    """Peak device bytes of one step (absolute), its wall time, and how the peak was read."""

    peak_bytes: int
    seconds: float
    method: str


def measure_peak(
    step: Callable[[], object],
    *,
    resident: Sequence[torch.Tensor],
    device: torch.device,
    method: str = "auto",
) -> Measurement:
    """Run `step()` once and read its peak memory with `method`.

    - "cuda": `max_memory_allocated` after a reset, above the level at the step's start,
      plus the resident storages: everything the caching allocator hands out during the
      step, kernel workspaces included.
    - "tracker": a LiveStorageTracker: resident storages plus op outputs. Compiled code
      run inside it falls back to eager, so use it only for graphs memplan runs eagerly.
    - "allocator": the profiler's allocation events summed in time order: the peak above
      the starting level, which sees kernel scratch buffers and compiled code, plus the
      resident storages.
    "auto" reads the allocator: "cuda" on a CUDA device and "allocator" elsewhere. The
    tracker is a diagnostic: the difference from the allocator is kernels' own buffers.
    """
    device = torch.device(device)
    if method == "auto":
        method = "cuda" if device.type == "cuda" else "allocator"
    if method not in _METHODS:
        raise ValueError(f"unknown measure method {method!r}; expected one of {sorted(_METHODS)}")
    # Garbage from earlier work, collected in the middle of the step, would show up as frees
    # of blocks the step never allocated: the collector is held off. Not collected first:
    # held before the step, that garbage is no part of the peak above the step's start, and
    # after a compile a full collection takes about half a second (CPU, 2026-11-29).
    with collector_paused():
        peak, seconds = _METHODS[method](step, resident, device)
    return Measurement(peak_bytes=peak, seconds=seconds, method=method)


def median_step_seconds(
    step: Callable[[], object],
    *,
    device: torch.device,
    repeats: int = 5,
    warmup: int = 2,
) -> float:
    """Median wall time of `repeats` runs of `step()` after `warmup` unrecorded ones."""
    device = torch.device(device)
    for _ in range(warmup):
        step()
    return statistics.median(_timed(step, device) for _ in range(repeats))


def paired_step_seconds(
    step: Callable[[], object],
    reference: Callable[[], object],
    *,
    device: torch.device,
    repeats: int = 5,
    warmup: int = 2,
    alternate: bool = False,
) -> tuple[float, float]:
    """`step()`'s median wall time, and the median of its time over `reference()`'s, each
    pair timed back to back, after `warmup` unrecorded pairs. On a shared machine whose
    speed drifts over a long benchmark, the ratio compares steps timed minutes apart: the
    drift slows both of a pair alike. The reference runs first in each pair; with
    `alternate`, in every other pair only, so that whatever the first of two steps gains
    or loses over the second (caches, the allocator's free lists) favours neither."""
    device = torch.device(device)
    for _ in range(warmup):
        reference()
        step()
    seconds, ratios = [], []
    for pair in range(repeats):
        if alternate and pair % 2:
            took = _timed(step, device)
            other = _timed(reference, device)
        else:
            other = _timed(reference, device)
            took = _timed(step, device)
        seconds.append(took)
        ratios.append(took / other)
    return statistics.median(seconds), statistics.median(ratios)


def _measure_cuda(
    step: Callable[[], object], resident: Sequence[torch.Tensor], device: torch.device
) -> tuple[int, float]:
    if device.type != "cuda":
        raise ValueError(f"measure method 'cuda' needs a CUDA device, got {device}")
    torch.cuda.synchronize(device)
    # Memory held before the step that is not among its resident tensors (another model,
    # an optimizer's state, cuBLAS's workspace from earlier steps) is not the step's.
    start = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    seconds = _timed(step, device)
    above_start = torch.cuda.max_memory_allocated(device) - start
    return resident_bytes(resident, device) + above_start, seconds


def _measure_tracker(
    step: Callable[[], object], resident: Sequence[torch.Tensor], device: torch.device
) -> tuple[int, float]:
    tracker = LiveStorageTracker(resident, device=device)
    with tracker:
        seconds = _timed(step, device)
    return tracker.peak, seconds


def _measure_allocator(
    step: Callable[[], object], resident: Sequence[torch.Tensor], device: torch.device
) -> tuple[int, float]:
    with recording(device) as recorded:
        seconds = _timed(step, device)
    return resident_bytes(resident, device) + recorded.peak_above_start(), seconds


def resident_bytes(resident: Sequence[torch.Tensor], device: torch.device) -> int:
    """Bytes of the distinct storages of `resident` on `device`."""
    return LiveStorageTracker(resident, device=device).current


# A method runs the step once and returns (peak bytes, wall seconds).
_Method = Callable[[Callable[[], object], Sequence[torch.Tensor], torch.device], tuple[int, float]]
_METHODS: dict[str, _Method] = {
    "cuda": _measure_cuda,
    "tracker": _measure_tracker,
    "allocator": _measure_allocator,
}


def _timed(step: Callable[[], object], device: torch.device) -> float:
    """Wall seconds of one `step()`, waiting for queued device work on CUDA."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def _on(actual: torch.device, tracked: torch.device) -> bool:
    return actual.type == tracked.type and tracked.index in (None, actual.index)


def _dense_tensors(tree: object) -> list[torch.Tensor]:
    # Sparse and other non-strided layouts have no single storage; memplan's graphs are dense.
    return [
        x
        for x in compat.tree_leaves(tree)
        if isinstance(x, torch.Tensor) and x.layout is torch.strided
    ]
