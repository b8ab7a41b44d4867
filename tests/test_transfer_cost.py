"""The host time of a transfer's calls (planner/transfer_cost.py): measured on the device
once and cached, estimated where nothing runs, and priced in every plan that may offload."""

from __future__ import annotations

import math

import pytest
import torch

from memplan.core.budget import Budget
from memplan.core.errors import MemplanWarning
from memplan.planner import transfer_cost
from memplan.planner.capture import compile_training_step
from memplan.planner.options import PlanOptions
from memplan.planner.partitioner import Partitioner
from memplan.planner.profile_cache import ProfileCache
from memplan.planner.transfer_cost import ESTIMATED_SECONDS, transfer_seconds
from memplan.tools.zoo import ZOO

CPU = torch.device("cpu")


@pytest.fixture
def timings(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The calls' measurements made, each recorded as it returns."""
    made: list[float] = []
    measured = transfer_cost._measured

    def counted(device: torch.device) -> float:
        made.append(measured(device))
        return made[-1]

    monkeypatch.setattr(transfer_cost, "_measured", counted)
    return made


def test_the_calls_are_measured_once_per_device_and_then_read_from_the_cache(tmp_path, timings):
    cache = ProfileCache(tmp_path / "p.json")
    first = transfer_seconds(CPU, cache=cache)
    assert 0 < first < 0.1 and math.isfinite(first)
    again = transfer_seconds(CPU, cache=ProfileCache(tmp_path / "p.json"))  # a new process
    assert again == first
    assert len(timings) == 1


def test_measuring_the_calls_leaves_the_random_state_as_it_was(timings):
    state = torch.get_rng_state()
    transfer_seconds(CPU)
    assert timings and torch.equal(torch.get_rng_state(), state)


def test_without_measuring_the_estimate_is_used(timings):
    assert transfer_seconds(CPU, measure=False) == ESTIMATED_SECONDS
    assert timings == []


@pytest.mark.parametrize("offload", [True, False])
def test_a_plan_prices_the_calls_where_it_may_offload(tmp_path, offload):
    example = ZOO["mlp"]()
    cache = ProfileCache(tmp_path / "p.json")
    options = PlanOptions(offload=offload, progress=False)
    partitioner = Partitioner(Budget.parse("70%"), options, name="mlp", cache=cache)
    compile_training_step(example.model, example.inputs, partitioner)
    priced = partitioner.lowered[-1].graph.transfer_seconds
    assert priced == (transfer_seconds(CPU, cache=cache) if offload else 0.0)
    assert (priced > 0) == offload


def test_calls_that_fail_to_run_are_priced_at_the_estimate_with_a_warning_and_not_cached(
    tmp_path, monkeypatch
):
    measured, made = transfer_cost._measured, []

    def failing_once(device: torch.device) -> float:
        made.append(device)
        if len(made) == 1:
            raise RuntimeError("cannot pin host memory")
        return measured(device)

    monkeypatch.setattr(transfer_cost, "_measured", failing_once)
    cache = ProfileCache(tmp_path / "p.json")
    with pytest.warns(MemplanWarning, match="cannot pin host memory"):
        assert transfer_seconds(CPU, cache=cache) == ESTIMATED_SECONDS
    again = transfer_seconds(CPU, cache=cache)  # the estimate was not cached: measured now
    assert len(made) == 2 and again != ESTIMATED_SECONDS
    assert transfer_seconds(CPU, cache=ProfileCache(tmp_path / "p.json")) == again
    assert len(made) == 2
