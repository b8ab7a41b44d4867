"""tests/conftest.py's MEMPLAN_FAILURES_LOG: each failure is written, with why it failed,
as its test ends, once, under xdist too (benchmarks/gpu.sh reads it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = """
def test_fails():
    assert 1 == 2, "a planted failure"


def test_passes():
    pass
"""


@pytest.mark.parametrize("workers", [[], ["-n", "2"]], ids=["alone", "xdist"])
def test_a_failure_is_logged_once_with_its_reason(tmp_path: Path, workers: list[str]) -> None:
    shutil.copy(Path(__file__).with_name("conftest.py"), tmp_path)
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    log = tmp_path / "failures.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["MEMPLAN_FAILURES_LOG"] = str(log)
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *workers]
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 1, result.stdout
    text = log.read_text()
    assert text.count("test_sample.py::test_fails (call)") == 1, text
    assert "a planted failure" in text
    assert "test_passes" not in text
