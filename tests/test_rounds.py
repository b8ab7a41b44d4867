"""Which of the backend's rounds (plans of one graph, each compiled) is kept."""

from __future__ import annotations

import dataclasses

from test_plan_file import hand_made_plan

from memplan.planner.plan_file import Plan
from memplan.planner.rounds import kept_round

MiB = 2**20


def _round(status: str, peak: int, held: int, seconds: float) -> Plan:
    return dataclasses.replace(
        hand_made_plan(), status=status, compiled_peak=peak, held=held, predicted_time=seconds
    )


def test_the_fastest_within_the_budget_is_kept_else_the_least_peak() -> None:
    plans = [
        _round("feasible", 10 * MiB, 4 * MiB, 1.0),
        _round("feasible", 8 * MiB, 3 * MiB, 1.2),
        _round("feasible", 9 * MiB, 3 * MiB, 1.1),
    ]
    assert kept_round(plans, 9 * MiB) == 2
    assert kept_round(plans, 7 * MiB) == 1
    # Planned for the least (best effort): the least peak, though another holds.
    least = [dataclasses.replace(plans[0], status="best-effort"), *plans[1:]]
    assert kept_round(least, 9 * MiB) == 1


def test_leaving_a_later_graph_room_counts_it_against_what_a_plan_keeps() -> None:
    """Planned with a later graph's 16 MiB taken as resident for its whole run, the budget
    asked (13 MiB) is under the graph's least: its rounds are a least-memory plan (peak
    18.5, 9.5 kept for the backward) and the model's own checkpointing (peak 19, 7.5
    kept). The later graph runs between the forward and the backward: a plan holds where
    its peak is within 29 MiB and what it keeps within 13."""
    least = _round("best-effort", int(18.5 * MiB), int(9.5 * MiB), 1.0)
    as_written = _round("feasible", 19 * MiB, int(7.5 * MiB), 1.1)
    room = 16 * MiB
    assert kept_round([least, as_written], 13 * MiB, room) == 0  # both hold: the faster
    assert kept_round([least, as_written], 9 * MiB, room) == 1  # only the one keeping less
    assert kept_round([least, as_written], 9 * MiB) == 0  # without the room: the least peak
    # Neither holds: the one nearest, by what it keeps.
    assert kept_round([least, as_written], 5 * MiB, room) == 1
    # A round keeping little whose own peak is over the budget with the room given back.
    spiky = _round("feasible", 30 * MiB, 4 * MiB, 0.9)
    assert kept_round([least, spiky], 13 * MiB, room) == 0
    assert kept_round([least, spiky], 15 * MiB, room) == 1  # within: the faster
