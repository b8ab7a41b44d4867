"""The measured peak and time of a step: the tracker, the allocator reading, and timing."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import pytest
import torch

from memplan.passes.offload import OFFLOAD
from memplan.planner.allocator import UNKNOWN_SIZE, recording
from memplan.planner.granularity import allocated_bytes
from memplan.planner.measure import (
    LiveStorageTracker,
    Measurement,
    mark_host,
    measure_peak,
    median_step_seconds,
    paired_step_seconds,
)

CPU = torch.device("cpu")
F32 = 4  # bytes per float32


def test_tracker_counts_a_new_storage_by_its_bytes():
    with LiveStorageTracker() as tracker:
        t = torch.empty(1000, dtype=torch.float32)
        assert tracker.current == 1000 * F32
    del t


def test_a_view_adds_nothing_and_keeps_its_base_alive():
    with LiveStorageTracker() as tracker:
        t = torch.empty(1000)
        v = t[10:].view(10, 99)
        assert tracker.current == 4000
        del t
        assert tracker.current == 4000  # the view still holds the storage
        del v
        assert tracker.current == 0


def test_in_place_ops_and_untracked_inputs_allocate_nothing():
    before = torch.zeros(100)  # made before the tracker, not declared resident
    with LiveStorageTracker() as tracker:
        before.add_(1)
        before.t_()
        assert tracker.current == 0


def test_peak_of_a_known_sequence():
    # a: 4000 -> +b 2000: 6000 -> -a: 2000 -> +c 8000: 10000 (peak) -> -b: 8000
    with LiveStorageTracker() as tracker:
        a = torch.empty(1000)
        b = torch.empty(500)
        del a
        c = torch.empty(2000)
        del b
        assert (tracker.current, tracker.peak) == (8000, 10000)
    del c
    assert tracker.current == 0  # frees after the block still count down


def test_resident_storages_are_the_baseline_counted_once():
    p, q = torch.empty(1000), torch.empty(100)
    # p's view shares p's storage: 4000 + 400
    tracker = LiveStorageTracker([p, p.view(10, 100), q])
    assert (tracker.current, tracker.peak) == (4400, 4400)
    with tracker:
        r = p * 2  # +4000
    assert (tracker.current, tracker.peak) == (8400, 8400)
    del r


def test_host_storages_are_not_device_memory():
    with LiveStorageTracker() as tracker:
        kept = torch.empty(1000)
        counted = torch.empty(500)
        mark_host(counted)  # marked after it was counted: uncounted
        assert tracker.current == 4000
        host = OFFLOAD(kept)  # the offload op's copy: never counted, so never in the peak
        assert (tracker.current, tracker.peak) == (4000, 6000)
        again = host + 0  # a host storage's use is not itself host memory
        assert tracker.current == 8000
    del counted, host, again


def test_other_devices_are_ignored():
    with LiveStorageTracker(device="cpu") as tracker:
        m = torch.empty(1000, device="meta")
        assert tracker.current == 0
    del m


a64 = torch.randn(64, 64)  # 64 * 64 * 4 = 16384 B


def _matmuls() -> torch.Tensor:
    x = a64 @ a64
    y = x @ a64
    del x
    z = y @ a64
    return z.sum()


# resident a 16384 + x + y = 49152; x freed, z takes its place; then the sum's 4 B while
# y and z live: 16384 * 3 + 4
MATMULS_PEAK = 16384 * 3 + 4


@pytest.mark.parametrize("method", ["tracker", "allocator"])
def test_measure_peak_of_known_matmuls(method):
    m = measure_peak(_matmuls, resident=[a64], device=CPU, method=method)
    assert m == Measurement(peak_bytes=MATMULS_PEAK, seconds=m.seconds, method=method)
    assert m.seconds > 0


def test_auto_is_the_allocator_on_cpu():
    assert measure_peak(_matmuls, resident=[a64], device=CPU).method == "allocator"


def test_tracker_and_allocator_agree_on_a_training_step():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8))
    x = torch.randn(32, 64)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        model(x).sum().backward()

    resident = [x, *model.parameters()]
    tracked = measure_peak(step, resident=resident, device=CPU, method="tracker")
    allocated = measure_peak(step, resident=resident, device=CPU, method="allocator")
    assert tracked.peak_bytes == allocated.peak_bytes


def test_the_allocator_also_sees_kernel_scratch():
    # The CPU convolution unfolds its input into a scratch buffer inside the kernel: an
    # allocation no op returns, so the tracker cannot see it and reads a lower peak.
    x, w = torch.randn(2, 3, 64, 64), torch.randn(8, 3, 3, 3)

    def conv() -> torch.Tensor:
        return torch.nn.functional.conv2d(x, w)

    tracked = measure_peak(conv, resident=[x, w], device=CPU, method="tracker")
    allocated = measure_peak(conv, resident=[x, w], device=CPU, method="allocator")
    output = 2 * 8 * 62 * 62 * F32
    assert tracked.peak_bytes == x.nbytes + w.nbytes + output
    assert allocated.peak_bytes > tracked.peak_bytes


def test_bad_methods_are_refused():
    with pytest.raises(ValueError, match="unknown measure method"):
        measure_peak(_matmuls, resident=[], device=CPU, method="psychic")
    with pytest.raises(ValueError, match="needs a CUDA device"):
        measure_peak(_matmuls, resident=[], device=CPU, method="cuda")


def test_median_step_seconds_runs_warmup_and_repeats():
    calls = []
    seconds = median_step_seconds(lambda: calls.append(_matmuls()), device=CPU, repeats=3, warmup=2)
    assert len(calls) == 5
    assert seconds > 0


def test_paired_step_seconds_is_the_steps_time_over_the_references():
    calls: list[str] = []

    def sleeper(name: str, seconds: float) -> Callable[[], None]:
        return lambda: (calls.append(name), time.sleep(seconds))

    seconds, ratio = paired_step_seconds(
        sleeper("step", 0.02), sleeper("reference", 0.01), device=CPU, repeats=3, warmup=1
    )
    # Each pair runs the reference just before the step.
    assert calls == ["reference", "step"] * 4
    assert 0.02 <= seconds < 0.04
    assert 1.4 < ratio < 2.6


def test_alternate_pairs_put_the_step_first_in_every_other_pair():
    calls: list[str] = []
    paired_step_seconds(
        lambda: calls.append("step"),
        lambda: calls.append("reference"),
        device=CPU,
        repeats=4,
        warmup=1,
        alternate=True,
    )
    # The warm-up pair, then pairs with the reference first and second by turns.
    assert calls == ["reference", "step"] + ["reference", "step", "step", "reference"] * 2


def test_the_allocator_skips_frees_of_blocks_from_before_the_step():
    # The profiler reports the free of a block it saw allocated in an earlier session;
    # counted, it would pull the level below the step's start and hide the step's peak.
    held: dict[str, torch.Tensor] = {}

    def allocate() -> None:
        held["old"] = torch.randn(4096)

    def step() -> None:
        del held["old"]
        a, b = torch.randn(1024), torch.randn(1024)
        del a, b

    measure_peak(allocate, resident=[], device=CPU, method="allocator")
    assert measure_peak(step, resident=[], device=CPU, method="allocator").peak_bytes == 8192


def test_a_recording_drops_the_allocators_line_on_blocks_from_before_and_no_other(capfd):
    before = torch.randn(4096)
    with recording(CPU):
        del before  # c10 logs UNKNOWN_SIZE here, where it is its first such free
        # The line as c10 writes it, for a process where it was not the first.
        os.write(2, b"[W1205 CPUAllocator.cpp:245] " + UNKNOWN_SIZE + b", profiler ...\n")
        os.write(2, b"a line of the step's own\n")
    assert capfd.readouterr().err == "a line of the step's own\n"


def test_cuda_sizes_are_the_caching_allocators_blocks() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert [allocated_bytes(n, cuda) for n in (0, 1, 512, 513, 4096)] == [0, 512, 512, 1024, 4096]
    assert [allocated_bytes(n, cpu) for n in (0, 1, 513)] == [0, 1, 513]
