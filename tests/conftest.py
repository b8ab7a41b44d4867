"""Test-wide settings: no downloads, a private profile cache, deterministic torch."""

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
CACHE_MADE = pytest.StashKey[str]()


def pytest_configure(config) -> None:
    """A profile and plan cache of the run's own, unless one is given: set before xdist
    starts its workers, so that they share it."""
    import tempfile

    if "MEMPLAN_CACHE_DIR" not in os.environ:
        config.stash[CACHE_MADE] = tempfile.mkdtemp(prefix="memplan-cache-")
        os.environ["MEMPLAN_CACHE_DIR"] = config.stash[CACHE_MADE]


def pytest_unconfigure(config) -> None:
    """Removes the cache this process made (the workers made none)."""
    import shutil

    made = config.stash.get(CACHE_MADE, None)
    if made is not None:
        shutil.rmtree(made, ignore_errors=True)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Where MEMPLAN_FAILURES_LOG names a file, appends each failure's report to it as the
    test ends: pytest prints failures only when the whole run ends, so a run stopped by a
    time limit (benchmarks/gpu.sh on a lent GPU) would otherwise lose what failed and why.
    Under xdist the controller writes it, once; its workers do not."""
    path = os.environ.get("MEMPLAN_FAILURES_LOG")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(path, "a") as log:
            log.write(f"{report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


@pytest.fixture
def model_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """milp and cpsat without the director's starting schedule, to test their models'
    optima: the director searches orders that those models cannot express (Checkmate's
    stages keep first computations in id order), so with its start they may return a
    schedule faster than their model's optimum."""
    from memplan.solvers import warm_start

    monkeypatch.setattr(warm_start, "director_sequence", lambda *args: None)


@pytest.fixture
def private_cache(tmp_path, monkeypatch) -> None:
    """A profile and plan cache of the test's own. In the run-wide one, a plan another
    test kept for the same graph and budget is applied without rounds, and another worker
    profiling the same model between a test's two compiles rewrites the node times the
    plan's key holds."""
    monkeypatch.setenv("MEMPLAN_CACHE_DIR", str(tmp_path))
