"""collector_paused: the cyclic collector is off inside the block and as it was after."""

from __future__ import annotations

import gc

import pytest

from memplan.core.collector import collector_paused


@pytest.fixture
def collector_restored():
    was_enabled = gc.isenabled()
    yield
    if was_enabled:
        gc.enable()
    else:
        gc.disable()


@pytest.mark.parametrize("enabled", [True, False])
def test_off_inside_and_as_before_after(collector_restored, enabled: bool) -> None:
    gc.enable() if enabled else gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled() is enabled


def test_restored_when_the_block_raises(collector_restored) -> None:
    gc.enable()
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("out of the block")
    assert gc.isenabled()
