"""The largest-batch search (memplan/maxbatch.py) and `memplan maxbatch`: the cap is
enforced, the search lands on the boundary, and memplan trains a larger batch than eager."""

from __future__ import annotations

import json
import math
from collections.abc import Callable

import pytest
import torch

from memplan.cli.main import main
from memplan.core.errors import MemplanError
from memplan.tools import batch_search, maxbatch
from memplan.tools.verify import resident_tensors, training_step
from memplan.tools.zoo import mlp

CPU = torch.device("cpu")
CAP = 3 << 20  # 3 MiB: the MLP's parameters and gradients are under 0.7 MiB


def build(batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    example = mlp(batch=batch)
    return example.model, example.inputs


def fits(batch: int) -> bool:
    model, inputs = build(batch)
    try:
        with maxbatch.capped(CAP, resident_tensors(model, inputs), CPU):
            training_step(model, inputs)()
    except torch.OutOfMemoryError:
        return False
    return True


def test_the_cap_raises_out_of_memory_on_cpu():
    model, inputs = build(64)
    with maxbatch.capped(CAP, resident_tensors(model, inputs), CPU):
        training_step(model, inputs)()
    model, inputs = build(4096)
    capped = maxbatch.capped(CAP, resident_tensors(model, inputs), CPU)
    with pytest.raises(torch.OutOfMemoryError, match="above the cap"), capped:
        training_step(model, inputs)()


def test_eager_search_lands_on_the_largest_batch_that_fits():
    [eager] = maxbatch.max_batch(build, CAP, ["eager"], start=16, limit=4096, repeats=1)
    assert eager.batch > 16 and eager.step_seconds is not None
    assert fits(eager.batch) and not fits(eager.batch + 1)
    tried = {p.batch: p.fits for p in eager.probes}
    assert tried[eager.batch] and not tried[eager.batch + 1]  # bisection closed the gap


def test_memplan_trains_a_larger_batch_than_eager_under_the_same_cap():
    seen: list[tuple[str, int, bool]] = []
    results = maxbatch.max_batch(
        build,
        CAP,
        ["eager", "memplan"],
        overhead=math.inf,  # only memory decides here; the step-time limit has its own test
        start=64,
        limit=4096,
        repeats=1,
        on_probe=lambda method, probe: seen.append((method, probe.batch, probe.fits)),
    )
    eager, planned = results
    assert planned.method == "memplan" and planned.setting == "greedy"
    assert planned.batch > eager.batch
    assert ("memplan", planned.batch, True) in seen
    failed = [p for p in planned.probes if not p.fits]
    assert failed and all(p.batch > planned.batch for p in failed)


def test_no_overhead_limit_lets_a_slow_step_fit(monkeypatch):
    """With `overhead=math.inf` time decides nothing: each step timed here is ten times
    slower than the one before, yet memplan's search still lands above eager's batch.
    (A finite limit, however generous, lets a stalled step on a loaded machine fail a
    batch below the boundary.)"""
    times = iter(10.0**k for k in range(1000))
    monkeypatch.setattr(maxbatch, "median_step_seconds", lambda *_, **__: next(times))
    eager, planned = maxbatch.max_batch(
        build, CAP, ["eager", "memplan"], overhead=math.inf, start=64, limit=4096, repeats=1
    )
    assert planned.batch > eager.batch
    assert all(p.step_seconds is None for p in planned.probes if not p.fits)


def test_every_fit_is_within_the_overhead_limit():
    """With no overhead allowed, a batch fits memplan only if its time per sample is at
    most eager's at eager's largest batch; a batch that ran but was slower says so."""
    eager, planned = maxbatch.max_batch(
        build, CAP, ["eager", "memplan"], overhead=0.0, start=64, limit=4096
    )
    allowed = eager.step_seconds / eager.batch  # type: ignore[operator]
    for probe in planned.probes:
        if probe.fits:
            assert probe.step_seconds / probe.batch <= allowed  # type: ignore[operator]
        elif probe.step_seconds is not None:
            assert "overhead limit" in probe.reason


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"methods": ["lazy"]}, "unknown method"),
        ({"cap_bytes": 0}, "positive cap"),
        ({"start": 0}, "start"),
        ({"overhead": -0.5}, "overhead"),
        ({"overhead": float("nan")}, "overhead"),
    ],
)
def test_bad_arguments_are_memplan_errors(kwargs, message):
    arguments = {"build": build, "cap_bytes": CAP, **kwargs}
    with pytest.raises(MemplanError, match=message):
        maxbatch.max_batch(**arguments)


def test_builder_names_a_zoo_model_or_a_function():
    model, inputs = maxbatch.builder("mlp")(5)
    assert isinstance(model, torch.nn.Module) and inputs[0].shape[0] == 5
    model, inputs = maxbatch.builder("memplan.tools.zoo:cnn")(3)
    assert isinstance(model, torch.nn.Module) and inputs[0].shape[0] == 3
    with pytest.raises(MemplanError, match="unknown model"):
        maxbatch.builder("alexnet")
    with pytest.raises(MemplanError, match="cannot load"):
        maxbatch.builder("memplan.tools.zoo:nothing_here")


def test_cli_writes_each_methods_largest_batch(tmp_path, capsys):
    out = tmp_path / "maxbatch.json"
    argv = ["maxbatch", "mlp", "--cap", "3MiB", "--methods", "eager", "--start", "256"]
    assert main([*argv, "--max-batch", "2048", "-o", str(out)]) == 0
    found = json.loads(out.read_text())
    [eager] = found["results"]
    assert found["model"] == "mlp" and eager["method"] == "eager"
    assert eager["cap_bytes"] == CAP and fits(eager["batch"]) and not fits(eager["batch"] + 1)
    assert "largest batch under 3.00 MiB" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cap", "50%"], "amount of memory"),
        (["--cap", "0"], "budget"),
        (["--cap", "1MiB", "--start", "9", "--max-batch", "4"], "above --max-batch"),
        (["--cap", "1MiB", "--solver", "nope"], "unknown solver"),
    ],
)
def test_cli_bad_input_is_one_line(tmp_path, capsys, argv, message):
    out = tmp_path / "never.json"
    assert main(["maxbatch", "mlp", *argv, "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()


def fake_attempt(
    runs_up_to: int, fast_from: int, fast_up_to: int
) -> Callable[[int], batch_search.Probe]:
    """A method that runs under the cap up to `runs_up_to` and is fast enough between
    `fast_from` and `fast_up_to`: small batches waste the device, large ones recompute."""

    def attempt(batch: int) -> batch_search.Probe:
        if batch > runs_up_to:
            return batch_search.Probe(batch, False, reason="out of memory")
        fast = fast_from <= batch <= fast_up_to
        return batch_search.Probe(batch, fast, "fake", 0.01 * batch, "" if fast else "too slow")

    return attempt


@pytest.mark.parametrize(
    ("runs_up_to", "fast_from", "fast_up_to", "expected"),
    [
        (40, 12, 30, 30),  # too slow at the start, fast higher up, too slow near the cap
        (40, 1, 40, 40),  # fast wherever it runs: the memory boundary
        (40, 1, 5, 5),  # fast only below the start
        (40, 50, 60, 0),  # never fast enough under the cap
        (3, 1, 3, 3),  # does not run at the start
    ],
)
def test_search_finds_the_largest_batch_under_both_limits(
    runs_up_to, fast_from, fast_up_to, expected
):
    tried: list[int] = []
    found = batch_search.search(
        "fake",
        fake_attempt(runs_up_to, fast_from, fast_up_to),
        CAP,
        start=8,
        limit=1 << 10,
        on_probe=lambda method, probe: tried.append(probe.batch),
    )
    assert found.batch == expected
    assert len(tried) == len(set(tried)), "a batch size was run twice"
    assert [p.batch for p in found.probes] == tried
    if expected:
        assert found.step_seconds == pytest.approx(0.01 * expected)
