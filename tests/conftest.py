"""Test-wide settings: no downloads, a private profile cache, deterministic torch."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def pytest_configure(config) -> None:
    import tempfile

    os.environ.setdefault("MEMPLAN_CACHE_DIR", tempfile.mkdtemp(prefix="memplan-cache-"))


@pytest.fixture
def model_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """milp and cpsat without the director's starting schedule, to test their models'
    optima: the director searches orders that those models cannot express (Checkmate's
    stages keep first computations in id order), so with its start they may return a
    schedule faster than their model's optimum."""
    from memplan.solvers import warm_start

    monkeypatch.setattr(warm_start, "director_sequence", lambda *args: None)
