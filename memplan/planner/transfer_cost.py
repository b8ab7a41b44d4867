"""The host time of one transfer's calls: what the simulator charges the compute stream
per offload and per prefetch (Graph.transfer_seconds).

Each offloaded tensor costs four calls of memplan's transfer ops (passes/offload.py) in
the step the backend compiles: `offload` and `release` in the forward, `prefetch` and
`wait` in the backward. They are Python calls through the dispatcher, and each one makes
a copy-stream event or waits on one. The host makes them between the kernels it launches,
so in a step whose host runs behind its GPU (a launch-bound step, as small models compile
to) each adds to the step. On an H200 (2026-11-28, docs/gpu.md) a round trip took about
270 us of host time for 4 KiB to 1 MiB, where its copies took 40 us at 1 MiB; priced at
nothing, plans offloading 45 tensors were predicted faster than recomputing and ran three
times slower.

Measured once per device and torch version, on a made-up tensor (planner/made_up.py: the
user's random state is left as it was), and kept in the profile cache. Where the calls
fail to run (a device short of pinned host memory, say), the estimate is used with a
MemplanWarning that names the failure, and nothing is cached, as profile.py does for a
node that cannot run alone.
"""

from __future__ import annotations

import statistics
import time
import warnings

import torch

from memplan import compat
from memplan.core.errors import MemplanWarning
from memplan.passes.offload import OFFLOAD, PREFETCH, RELEASE, WAIT
from memplan.planner.made_up import float_pool, made_up
from memplan.planner.profile_cache import Cost, ProfileCache, device_name

# Where the calls cannot be timed (planning for a GPU one does not have): half of the
# round trip measured on an H200 host (16 cores, torch 2.11), 266 us (docs/gpu.md).
ESTIMATED_SECONDS = 133e-6
_MEASURED_BYTES = 1 << 20  # the calls' time did not depend on the size up to 1 MiB
_WARMUP, _REPEATS = 10, 50


def transfer_seconds(
    device: torch.device, *, measure: bool = True, cache: ProfileCache | None = None
) -> float:
    """The host seconds of one transfer's calls on `device` (half a round trip): measured
    (or read from `cache`), or the estimate where `measure` is False or the calls fail."""
    if not measure:
        return ESTIMATED_SECONDS
    key = f"memplan.transfer_calls|{device.type}|{device_name(device)}|{torch.__version__}"
    cached = cache.get(key) if cache is not None else None
    if cached is not None:
        return cached.seconds
    # AOTAutograd plans under its fake tensor mode: the calls are timed on real tensors.
    try:
        with compat.real_tensors():
            seconds = _measured(device)
    except RuntimeError as error:
        warnings.warn(
            f"memplan's transfer ops could not be timed on {device} ({error}): each "
            f"transfer's host calls are priced at the estimate, {ESTIMATED_SECONDS * 1e6:.0f} us",
            MemplanWarning,
            stacklevel=2,
        )
        return ESTIMATED_SECONDS
    if cache is not None:
        return cache.update({key: Cost(seconds, 0)})[key].seconds
    return seconds


def _measured(device: torch.device) -> float:
    """Half the median host time of a round trip of the four calls, as a compiled step
    makes them: with nothing waited on in between."""
    floats = _MEASURED_BYTES // 4
    tensor = made_up((floats,), (1,), 0, torch.float32, device, float_pool(floats, device))
    after = [torch.empty(1, device=device)]

    def round_trip() -> None:
        host = OFFLOAD(tensor)
        RELEASE(tensor, host)
        WAIT(PREFETCH(host, device, after), after)

    for _ in range(_WARMUP):
        round_trip()
    samples = []
    for _ in range(_REPEATS):
        started = time.perf_counter()
        round_trip()
        samples.append(time.perf_counter() - started)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return statistics.median(samples) / 2
