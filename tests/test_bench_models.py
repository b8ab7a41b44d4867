"""The head-to-head benchmarks' verdicts (benchmarks/models.py, benchmarks/compiled.py) on
hand-made runs: which memplan run dominates a PyTorch point, the Pareto front, the targets'
wording; and a head-to-head timing of compiled twins on a small model."""

from __future__ import annotations

from benchmarks.models import Run, _front, dominating, model_targets

MIB = 2**20


def run(method: str, setting: str, peak_mib: float, ms: float, budget_mib: float | None = None):
    return Run(
        model="m",
        method=method,
        setting=setting,
        solver="greedy" if method == "memplan" else None,
        status="ok",
        budget=None if budget_mib is None else int(budget_mib * MIB),
        measured_peak=int(peak_mib * MIB),
        step_seconds=ms / 1e3,
    )


EAGER = run("eager", "", 100, 100)
PYTORCH = [run("pytorch", "1.0", 80, 100), run("pytorch", "0.2", 60, 150)]


def test_a_memplan_run_dominates_within_two_percent_and_no_more():
    within = run("memplan", "70%", 79, 101.9, 80)
    slower = run("memplan", "50%", 50, 102.1, 60)
    assert dominating([within, slower], PYTORCH[0]) is within
    assert dominating([slower], PYTORCH[0]) is None
    assert dominating([run("memplan", "90%", 81, 90, 90)], PYTORCH[0]) is None  # higher peak


def test_front_keeps_only_runs_nothing_beats_on_both_axes():
    a, b, c = (
        run("memplan", "a", 50, 200),
        run("memplan", "b", 70, 110),
        run("memplan", "c", 75, 120),
    )
    assert _front([c, a, b]) == [b, a]


def test_targets_name_the_misses_with_figures():
    planned = [
        run("memplan", "90%", 80, 100, 90),
        run("memplan", "50%", 44, 140, 45),
        run("memplan", "30%", 31, 200, 30),  # over its budget by 1 MiB
    ]
    lines = model_targets([EAGER, *PYTORCH, *planned])
    assert lines[0].startswith("- Measured peak within the budget: 2 of 3")
    assert "memplan greedy 30% by 1.00 MiB" in lines[0]
    assert "dominates 2 of PyTorch's 2 points: every one." in lines[1]
    # PyTorch's smallest peak is 60 MiB at 150 ms; memplan has 44 MiB at 140 ms: 26.7% lower.
    assert "26.7% lower; the target of 25% lower is met" in lines[2]


def test_targets_say_when_no_memplan_run_peaks_as_low():
    lines = model_targets([EAGER, *PYTORCH, run("memplan", "90%", 90, 100, 90)])
    assert "dominates 0 of PyTorch's 2 points" in lines[1]
    assert "no memplan run peaks that low" in lines[1]
    # At PyTorch's smallest peak (60 MiB, 150 ms) the only memplan run as fast peaks higher.
    assert "50.0% higher; the target of 25% lower is missed" in lines[2]


def test_a_compiled_run_above_its_prediction_lists_what_its_peak_held():
    """benchmarks.compiled keeps, for a run measured above its prediction, the largest
    groups of blocks live at its peak, and its page lists them under the table."""
    from dataclasses import asdict

    from benchmarks.compiled import CompiledRun, table

    def compiled(r: Run, **fields: object) -> CompiledRun:
        return CompiledRun(**{**asdict(r), "max_grad_error": 0.0, **fields})

    held = [[MIB, 3, "aten::mm"], [4096, 2, "aten::empty_strided < aten::gelu"]]
    over = compiled(run("memplan", "70%", 81, 100, 80), at_peak=held)
    exact = compiled(run("memplan", "50%", 60, 100, 70))
    saved = CompiledRun(**asdict(over))  # as the JSON gives it back
    lines = table([compiled(EAGER), saved, exact])
    listed = [line for line in lines if "held at its peak" in line]
    assert listed == [
        "- memplan greedy 70%, measured above its prediction, held at its peak: "
        "3 x 1.00 MiB by `aten::mm`; 2 x 4.00 KiB by `aten::empty_strided < aten::gelu`"
    ]


def test_a_compiled_run_is_marked_best_effort_only_where_its_plan_was():
    """The page marks a prediction "(best effort)" where the plan predicts more than the
    run's budget, not where a round on the way to it was best effort (the least run's
    1-byte round) or the backend planned a round off the budget to hold it."""
    from dataclasses import asdict

    from benchmarks.compiled import CompiledRun, table_row

    def row(predicted_mib: float, note: str) -> str:
        fields = asdict(run("memplan", "least", 42, 100, 42.56))
        fields.update(max_grad_error=0.0, predicted_peak=int(predicted_mib * MIB), notes=[note])
        return table_row(CompiledRun(**fields), EAGER)

    least = (
        "graph0.3: budget 1 B is infeasible; planned for its smallest feasible peak 33.66 MiB "
        "instead; planned at 1 B so that the graphs as Inductor compiled them peak within "
        "42.56 MiB"
    )
    assert "best effort" not in row(42.56, least)
    infeasible = "graph0: budget 42.56 MiB is infeasible; planned for its smallest feasible "
    assert "best effort" in row(43.1, infeasible + "peak 43.10 MiB instead")


def test_a_stopped_compiled_run_keeps_the_model_s_earlier_complete_runs():
    """benchmarks.compiled writes its JSON after each run; a model's earlier complete runs
    stay on the page until its new runs are complete, and a stopped run's are kept apart.
    Each model's section gives the time limit its solves ran under."""
    from dataclasses import asdict

    from benchmarks.compiled import CompiledRun, model_entry, section_text, while_running

    def compiled(r: Run) -> CompiledRun:
        return CompiledRun(**{**asdict(r), "max_grad_error": 0.0})

    sizes = {"batch": 4}
    earlier = model_entry([compiled(EAGER), *map(compiled, PYTORCH)], "2026-11-26", sizes, 60)
    partial = model_entry([compiled(run("eager", "", 90, 95))], "2026-11-27", sizes, 60)

    kept = while_running(partial, earlier)
    assert kept["runs"] == earlier["runs"] and kept["unfinished"] == partial
    again = while_running(partial, kept)  # a second stopped run replaces the first's
    assert again["runs"] == earlier["runs"] and again["unfinished"] == partial
    alone = while_running(partial, None)
    assert alone["runs"] == partial["runs"] and alone["complete"] is False
    assert while_running(partial, alone) == alone  # an incomplete entry is not kept

    where = {"device": "cpu", "device_name": "x86_64", "cpu_threads": 2, "torch": "2.13.0"}
    saved = {"machine": {**where, "date": "2026-11-27"}, "sizes": "bench", "solver": "greedy"}
    page = section_text({**saved, "repeats": 5, "models": {"a": kept, "b": alone}})
    assert "A later run (2026-11-27) was stopped after 1 run;" in page
    # the stopped run's own table, after the complete one's
    later = page.split("#### a: the later run (2026-11-27), stopped after 1 run")[1]
    assert later.split("### b")[0].count("| eager |") == 1
    assert "Incomplete: the benchmark was stopped after 1 run." in page
    assert section_text({**saved, "repeats": 5, "models": {"a": earlier}}).count("stopped") == 0
    assert "memplan's time limit per solve: 60 s." in page
    unrecorded = {k: v for k, v in earlier.items() if k != "time_limit"}
    older = section_text({**saved, "repeats": 5, "models": {"a": unrecorded}})
    assert "memplan's time limit per solve: 20 s, the benchmark's default" in older


def test_skipped_compiled_runs_leave_the_count_of_runs():
    """--skip and an empty --shares leave runs out of the progress bar's count: eager and
    torch.compile's points always run; each matched run stands beside one of them."""
    import argparse

    from benchmarks.compiled import runs_per_model

    def count(*skip: str, shares: tuple[str, ...] = ("50%",)) -> int:
        config = argparse.Namespace(budgets=[1.0, 0.2], shares=list(shares), skip=list(skip))
        return runs_per_model(config)

    assert count() == 1 + 2 + 1 + 1 + 2 + 1
    assert count("matched") == count() - 2
    assert count("least", "below", shares=()) == 1 + 2 + 2


def test_models_are_dated_by_the_run_that_measured_them():
    """benchmarks.models keeps the models a run did not (or not yet) measure, each with its
    own day, and its page names the days where they differ."""
    from dataclasses import asdict, replace

    from benchmarks.models import model_dates
    from benchmarks.pages import measured_on

    runs = [EAGER, replace(EAGER, model="n")]
    before_dates = {"machine": {"date": "2026-11-24"}, "runs": [asdict(r) for r in runs]}
    assert model_dates(before_dates, runs) == {"m": "2026-11-24", "n": "2026-11-24"}
    dated = {**before_dates, "dates": {"m": "2026-11-27"}}
    dates = model_dates(dated, runs)
    assert dates == {"m": "2026-11-27", "n": "2026-11-24"}
    assert measured_on(dates)[0].endswith("that day: m 2026-11-27, n 2026-11-24.")
    assert measured_on(model_dates(before_dates, runs)) == []


def test_head_to_head_judges_each_run_against_its_own_point():
    """The runs timed back to back against their torch.compile point are judged on that
    ratio alone: 2% of slack for the first target, none for the second."""
    from dataclasses import asdict

    from benchmarks.compiled import BELOW_LEAST, CompiledRun, head_to_head

    def compiled(r: Run, against: str = "", ratio: float | None = None) -> CompiledRun:
        pairs = 11 if against else 0
        fields = {"against": against, "against_ratio": ratio, "against_pairs": pairs}
        return CompiledRun(**{**asdict(r), **fields})

    points = [compiled(p) for p in PYTORCH]  # 80 MiB and 60 MiB
    assert head_to_head([compiled(EAGER), *points]) == []  # runs taken before the pairing
    within = compiled(run("memplan", "matched 1.0", 79, 500, 80), "1.0", 1.019)
    slower = compiled(run("memplan", "matched 0.2", 59, 10, 60), "0.2", 1.021)
    below = compiled(run("memplan", BELOW_LEAST, 44, 10, 45), "0.2", 1.0)
    lines = head_to_head([compiled(EAGER), *points, within, slower, below])
    assert (
        "| memplan greedy matched 1.0 | 79.00 MiB | pytorch 1.0 | 80.00 MiB | x1.019 | 11 "
        "| yes |" in lines
    )
    assert (
        "| memplan greedy matched 0.2 | 59.00 MiB | pytorch 0.2 | 60.00 MiB | x1.021 | 11 "
        "| no |" in lines
    )
    assert "- Head to head, memplan's matched runs dominate 1 of 2 torch.compile points" in "".join(
        lines
    )
    assert "not 0.2." in "".join(lines)
    # 44 MiB against 60: 26.7% lower, at exactly the point's time.
    assert "26.7% lower, at x1.000 its step time; the second target" in "".join(lines)
    assert "is met." in "".join(lines)
    slow = compiled(run("memplan", BELOW_LEAST, 44, 10, 45), "0.2", 1.001)
    assert "is missed." in "".join(head_to_head([*points, slow]))
    assert "noise floor" not in "".join(lines)
    itself = compiled(PYTORCH[0], "1.0", 0.97)  # the point timed against a twin of itself
    floor = head_to_head([itself, points[1], within])
    assert (
        "- The noise floor: pytorch 1.0 timed the same way against a twin of itself " in floor[-2]
    )
    assert floor[-2].endswith("read x0.970 over 11 pairs.")
    assert sum("| pytorch 1.0 |" in line for line in floor) == 1  # judged rows: memplan's


def test_head_to_head_pairs_fill_their_time_and_never_fall_below_the_least():
    from benchmarks.compiled import HEAD_TO_HEAD_SECONDS, head_to_head_pairs

    assert head_to_head_pairs(5, step_seconds=10.0) == 11  # a slow step: the least
    fast = head_to_head_pairs(5, step_seconds=0.085)  # ResNet-50's step on this CPU
    assert fast * 2 * 0.085 >= HEAD_TO_HEAD_SECONDS > (fast - 1) * 2 * 0.085


def test_runs_timed_head_to_head_against_a_twin_compiled_beside_them():
    """A memplan run and a twin of its torch.compile point live in one process and are
    timed back to back: the twin compiles one graph of its own (a twin that ran memplan's
    graphs, or a recompile, would fail the run), and a point against itself may share
    its graph."""
    from benchmarks.compiled import Compiled, sizes_of
    from benchmarks.models import Bench
    from memplan.tools.zoo import ZOO

    bench = Bench(ZOO["cnn"](**sizes_of("cnn", "small")), 3, 20.0)
    runner = Compiled(bench, "greedy", 20.0, head_to_head_seconds=0.0)  # the least pairs
    runner.eager()
    point = runner.pytorch(1.0, against_itself=True)
    assert point.status == "ok" and point.against == "1.0" and point.against_pairs == 7
    assert point.against_ratio is not None and 0 < point.against_ratio < 10
    assert point.measured_peak is not None
    matched = runner.memplan("matched 1.0", point.measured_peak, against="1.0")
    assert matched.status == "ok", matched.status
    assert matched.against == "1.0" and matched.graphs == 1  # the twin's is not the run's
    assert matched.against_ratio is not None and 0 < matched.against_ratio < 10
