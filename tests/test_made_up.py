"""Made-up values (planner/made_up.py) and the compile path's kernel workspaces, which
run on them: the layout asked for, the pool repeated, torch's global generator untouched."""

from __future__ import annotations

import pytest
import torch

from memplan.compile.kernels import KernelCall, TensorSpec, workspaces
from memplan.planner.made_up import POOL_FLOATS, float_pool, made_up, span, tiled

CPU = torch.device("cpu")


@pytest.mark.parametrize("length", [0, 1, 3, 7, 64])
def test_a_made_up_value_repeats_the_pool(length):
    pool = torch.tensor([1.0, 2.0, 3.0])
    filled = tiled(torch.full((length,), float("nan"), dtype=torch.float64), pool)
    assert filled.tolist() == [float(1 + i % 3) for i in range(length)]


def test_a_made_up_tensor_has_its_layout_and_a_storage_of_what_it_reaches():
    pool = float_pool(1000, CPU)
    value = made_up((3, 4), (1, 5), 2, torch.float32, CPU, pool)
    assert (value.shape, value.stride(), value.storage_offset()) == ((3, 4), (1, 5), 2)
    assert value.untyped_storage().nbytes() == (2 + span((3, 4), (1, 5))) * 4 == 4 * 20
    assert torch.equal(value.as_strided((20,), (1,), 0), pool[:20])


def test_integers_are_zero_and_an_empty_tensor_holds_nothing():
    pool = float_pool(8, CPU)
    assert not made_up((5, 2), (2, 1), 0, torch.int64, CPU, pool).any()
    empty = made_up((0, 4), (4, 1), 0, torch.float32, CPU, pool)
    assert empty.shape == (0, 4) and empty.untyped_storage().nbytes() == 0


def test_the_pool_is_as_long_as_asked_up_to_its_cap_and_the_same_each_time():
    assert float_pool(0, CPU).numel() == 1
    assert float_pool(10, CPU).numel() == 10
    assert float_pool(10 * POOL_FLOATS, CPU).numel() == POOL_FLOATS
    assert torch.equal(float_pool(100, CPU), float_pool(100, CPU))


def test_measuring_a_kernels_workspace_leaves_the_random_state_as_it_was():
    """Compiling measures extern kernels on made-up values; a step compiled with memplan
    must draw the same dropout masks as one compiled without it."""
    spec = TensorSpec((37, 41), (41, 1), 0, torch.float32, CPU)
    other = TensorSpec((41, 43), (1, 41), 0, torch.float32, CPU)
    call = KernelCall(torch.ops.aten.mm.default, (spec, other), ())
    state = torch.get_rng_state()
    found = workspaces([call])
    assert torch.equal(torch.get_rng_state(), state)
    assert found[call.key] >= 0
