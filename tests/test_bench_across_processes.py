"""benchmarks.across_processes: the head-to-head's cases, run again in fresh processes."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from benchmarks import across_processes
from benchmarks.across_processes import FLOOR, cases, in_fresh_process, markdown, verdict
from benchmarks.compiled import BELOW_LEAST
from memplan.core.errors import MemplanError

MIB = 1 << 20


def _run(method: str, setting: str, **fields: Any) -> dict[str, Any]:
    base = {"method": method, "setting": setting, "budget": None, "measured_peak": 0}
    return base | {"against": "", "against_ratio": None, "against_pairs": 0} | fields


def _compiled() -> dict[str, Any]:
    """benchmarks.compiled's results for one model: two points, the first timed against a
    twin of itself, a matched run, a run below the least, and a share never head to head."""
    runs = [
        _run("eager", "", measured_peak=200 * MIB),
        _run("pytorch", "1.0", measured_peak=100 * MIB, against="1.0", against_ratio=1.01)
        | {"against_pairs": 40},
        _run("pytorch", "0.8", measured_peak=80 * MIB),
        _run("memplan", "70%", budget=140 * MIB, measured_peak=130 * MIB),
        # As recorded where infeasible: the least its planner reported, over the point's.
        _run("memplan", "matched 0.8", budget=85 * MIB, measured_peak=79 * MIB)
        | {"against": "0.8", "against_ratio": 1.03, "against_pairs": 30},
        # Infeasible at 75% of 80 MiB: planned for the least its planner reported.
        _run("memplan", BELOW_LEAST, budget=70 * MIB, measured_peak=68 * MIB)
        | {"against": "0.8", "against_ratio": 1.05, "against_pairs": 20},
    ]
    entry = {"date": "2026-11-28", "time_limit": 60.0, "runs": runs}
    return {"repeats": 5, "solver": "greedy", "models": {"cnn": entry}}


def test_the_cases_are_the_runs_timed_head_to_head() -> None:
    """The noise floor and memplan's head-to-head runs, each with its point's peak, the
    budget it was asked and its single-process figures; a run never timed head to head is
    no case."""
    found = cases(_compiled(), "cnn")
    assert [c["setting"] for c in found] == [FLOOR, "matched 0.8", BELOW_LEAST]
    floor, matched, below = found
    assert floor["budget"] is None and floor["point_peak"] == 100 * MIB
    assert matched["budget"] == 80 * MIB and matched["point_peak"] == 80 * MIB
    assert matched["single"] == {"ratio": 1.03, "pairs": 30, "peak": 79 * MIB}
    assert below["against"] == "0.8" and below["time_limit"] == 60.0
    assert below["budget"] == 60 * MIB  # the budget it was asked, not the one it recorded


def _with(case: dict[str, Any], *processes: tuple[float | None, int | None]) -> dict[str, Any]:
    found = [{"ratio": r, "pairs": 20, "peak": p, "status": "ok"} for r, p in processes]
    return case | {"processes": found}


def test_the_verdict_is_on_the_median_over_processes() -> None:
    """A matched run dominates on the median ratio within the slack, and only where no
    process peaked above the point; the run below the least needs 25% lower at no more
    time; the noise floor has no verdict."""
    floor, matched, below = cases(_compiled(), "cnn")
    under = 79 * MIB
    assert verdict(_with(matched, (0.98, under), (1.04, under), (1.01, under))) == "dominates"
    assert verdict(_with(matched, (1.03, under), (1.04, under), (0.98, under))) != "dominates"
    over = _with(matched, (0.9, under), (0.9, 81 * MIB), (0.9, under))
    assert verdict(over) == "does not dominate"
    assert verdict(_with(below, (0.99, 58 * MIB), (1.02, 58 * MIB), (0.97, 58 * MIB))) == "met"
    assert verdict(_with(below, (0.99, 61 * MIB), (0.99, 58 * MIB), (0.97, 58 * MIB))) == "missed"
    assert verdict(_with(below, (1.01, 58 * MIB), (1.02, 58 * MIB), (0.97, 58 * MIB))) == "missed"
    assert verdict(_with(floor, (1.0, 100 * MIB))) == "-"


def test_a_process_that_fails_is_recorded_and_shown() -> None:
    """A case's process that raises reports its error to the one that started it, and the
    page lists it; the median is over the processes that measured, and with one failed
    the case has no verdict."""
    spec = {"model": "no such model", "sizes": "small", "device": "cpu", "repeats": 5}
    failed = in_fresh_process(spec | {"solver": "greedy", "seconds": 0.0, "time_limit": 1.0})
    assert failed["ratio"] is None and failed["status"].startswith("error: ")
    assert "no such model" in failed["status"]
    _, matched, _ = cases(_compiled(), "cnn")
    measured = {"ratio": 1.02, "pairs": 20, "peak": 79 * MIB, "status": "ok"}
    model = {"compiled_date": "2026-11-27"}
    machine = {"device": "cpu", "device_name": "x86_64", "cpu_threads": 2, "torch": "2.13.0"}
    data = {
        "machine": machine | {"date": "2026-11-28"},
        "processes": 2,
        "seconds": 15.0,
        "models": {
            "cnn": model
            | {"cases": [matched | {"date": "2026-11-28", "processes": [measured, failed]}]}
        },
    }
    page = markdown(data)
    row = "| matched 0.8 | 80.00 MiB | 0.8 | 80.00 MiB | 79.00 MiB, - | x1.020 (20), failed "
    row += "| x1.020 "
    assert row + "| x1.030 at 79.00 MiB (30 pairs) | - |" in page
    assert "- On the medians, memplan's matched runs dominate 0 of 1." in page
    assert f"- A process failed: {failed['status']}" in page
    assert "Measured 2026-11-28; the cases are from benchmarks.compiled's run of 2026-11-27" in page


def test_a_rerun_of_chosen_cases_keeps_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --settings, only those cases run again, in as many processes as asked, each
    given its budget and point; the model's other cases keep their earlier processes. A
    setting no case has is an error before anything runs."""
    (tmp_path / "compiled-cpu.json").write_text(json.dumps(_compiled()))
    monkeypatch.setattr(across_processes, "RESULTS", tmp_path)
    given: list[dict[str, Any]] = []

    def measured(spec: dict[str, Any]) -> dict[str, Any]:
        given.append(spec)
        return {"ratio": 0.99, "pairs": 11, "peak": 79 * MIB, "status": "ok"}

    monkeypatch.setattr(across_processes, "in_fresh_process", measured)
    earlier = {"ratio": 1.01, "pairs": 30, "peak": 100 * MIB, "status": "ok"}
    path = tmp_path / "across-processes-cpu.json"
    old = [c | {"date": "2026-11-27", "processes": [earlier]} for c in cases(_compiled(), "cnn")]
    path.write_text(json.dumps({"models": {"cnn": {"compiled_date": "x", "cases": old}}}))
    args = argparse.Namespace(
        device="cpu", models=["cnn"], processes=2, seconds=0.0, sizes="small",
        settings=["matched 0.8"],
    )  # fmt: skip
    data = across_processes.run_cases(args, {"date": "2026-11-28"}, path)
    assert [(s["setting"], s["budget"], s["against"]) for s in given] == [
        ("matched 0.8", 80 * MIB, "0.8")
    ] * 2
    floor, matched, below = data["models"]["cnn"]["cases"]
    assert floor["processes"] == below["processes"] == [earlier]
    assert floor["date"] == "2026-11-27" and matched["date"] == "2026-11-28"
    assert [p["ratio"] for p in matched["processes"]] == [0.99, 0.99]
    assert json.loads(path.read_text()) == data
    with pytest.raises(MemplanError, match=re.escape("no head-to-head case 'matched 0.9' in cnn")):
        across_processes.run_cases(
            argparse.Namespace(**{**vars(args), "settings": ["matched 0.9"]}),
            {"date": "2026-11-29"},
            path,
        )
    assert json.loads(path.read_text()) == data  # nothing rewritten


def test_the_command_line_explains_itself(capsys: pytest.CaptureFixture[str]) -> None:
    """--help prints every option, the cases' settings among them."""
    with pytest.raises(SystemExit) as done:
        across_processes.main(["--help"])
    assert done.value.code == 0
    shown = " ".join(capsys.readouterr().out.split())  # as wrapped to the terminal
    assert "--settings" in shown and "75% of pytorch least" in shown and "--processes" in shown
