"""The search for a graph's plan under Inductor, as a pure policy: which round to try
next, and which round to keep.

A round plans the prepared graph at an aim (the bytes of its own peak, beyond what the
rest of the step holds), in a lane (Inductor's layout optimization as the user left it,
or off; or the step as the model is written), and reads the step's peak as Inductor
compiles it (compile/rounds.py). The policy sees only the rounds' outcomes, so it is
tested from a table without torch (tests/test_search.py):

- the first round aims at the target (the graph's budget);
- a round over the target is followed by one aimed lower by how far it was over; one
  well under it, that recomputes or offloads, by one aimed higher by the room it left
  (less recomputation, a faster step), where its plan, made before it is compiled,
  is predicted faster by FASTER of the step (`worth_compiling`); a raise that goes over
  the target is followed, once, by one aimed lower by how far over, and no raise aims
  at or past an aim that went over;
- a lane ends at its least-memory plan, followed by one round aimed at that plan's peak
  as compiled where it compiles higher than planned (recomputing less, its kernels can
  peak lower);
- where no round of a lane holds the target, the next lane is tried;
- the fastest round that holds the target is kept, else the lowest.
Below the least, the rounds are the same whatever the target (each lane's least-memory
plan and the round after it), so the least a budget is refused with is one the search
finds again when asked for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# An aim under every graph's least: the least-memory plan.
LEAST = 1
# The most rounds per graph: each is an Inductor compile.
MAX_ROUNDS = 8
# Room under the target worth planning again for, as a share of it.
SLACK = 0.05
# Aims this close (a share of the target) make the same plan, or nearly.
SAME_AIM = 0.001
# A raised round costs an Inductor compile, as long as torch.compile's own; a plan
# predicted faster by less than this share of the step is one no measurement here tells
# from the kept round's (the head to head allows 2% for a shared machine's noise, and one
# plan has read 5% apart in fresh processes). The tests' MLP at 60% made a third round
# that bought 0.45% of predicted time: without it, its first step took 12.3 and 10.2 s
# against 16.7 and 15.3 s (2-core CPU, Inductor's kernel cache warm, 2026-12-07).
FASTER = 0.02


@dataclass(frozen=True)
class Lane:
    """How a round is compiled: with Inductor's layout optimization as the user left it
    (`layout`), or off; or the step as the model is written (`written`)."""

    layout: bool = True
    written: bool = False


@dataclass(frozen=True)
class Attempt:
    """A round to try: the plan made at `aim`, compiled in `lane`."""

    aim: int
    lane: Lane = Lane()


@dataclass(frozen=True)
class Outcome:
    """What a round gave: its peak as compiled, what it keeps for its backward (`held`),
    its predicted time, its plan's peak as planned, whether its plan is the least-memory
    one (the solver found none within its aim), whether it recomputes or offloads
    anything, and whether its plan is one an earlier round of the lane made."""

    attempt: Attempt
    peak: int
    held: int
    time: float
    planned_peak: int
    least: bool
    saves: bool = True
    repeat: bool = False


@dataclass(frozen=True)
class Goal:
    """What the rounds aim for: the graph's budget (`target`), of what is resident the
    room a later graph needs between this graph's forward and backward (`room`), and the
    lanes open to the graph beyond the first."""

    target: int
    room: int = 0
    layout_off: bool = False  # a graph with convolutions, whose user left the setting
    written: bool = False  # a model that checkpoints its own blocks


def holds(outcome: Outcome, goal: Goal) -> bool:
    """Whether a round holds the target. Leaving a later graph room, its own peak holds it
    with the room given back, and what it keeps for its backward with the room taken."""
    if goal.room:
        return max(outcome.peak - goal.room, outcome.held) <= goal.target
    return outcome.peak <= goal.target


def next_attempt(history: Sequence[Outcome], goal: Goal) -> Attempt | None:
    """The round to try after `history`, or None: the search is over."""
    if not history:
        return Attempt(goal.target)
    if len(history) >= MAX_ROUNDS:
        return None
    within = [o for o in history if holds(o, goal)]
    if within:
        return _raised(history, within, goal)
    for lane in _lanes(goal):
        attempt = _in_lane(history, lane, goal)
        if attempt is not None:
            return attempt
    return None


def worth_compiling(history: Sequence[Outcome], goal: Goal, time: float) -> bool:
    """Whether the round `next_attempt` gave, its plan predicted to take `time`, is worth
    its compile: any round while none holds the target; one made while some round holds
    it (a raise, or the round after a raise that went over) only where it is predicted
    faster than the round it would replace by FASTER of its time. Otherwise the search
    is over."""
    within = [o for o in history if holds(o, goal)]
    if not within:
        return True
    return time < within[kept(within, goal)].time * (1 - FASTER)


def kept(history: Sequence[Outcome], goal: Goal) -> int:
    """The index of the round to keep: the fastest that holds the target (the lower peak
    among equally fast), else the lowest peak."""
    within = [i for i, o in enumerate(history) if holds(o, goal)]
    if within:
        return min(within, key=lambda i: (history[i].time, history[i].peak))
    return min(range(len(history)), key=lambda i: (_need(history[i], goal), history[i].time))


def _need(outcome: Outcome, goal: Goal) -> int:
    """The bytes a round needs of the target's kind: its peak, or leaving room, the most
    of its own peak without the room and what it keeps with it."""
    return max(outcome.peak - goal.room, outcome.held) if goal.room else outcome.peak


def _lanes(goal: Goal) -> list[Lane]:
    lanes = [Lane()]
    if goal.layout_off:
        lanes.append(Lane(layout=False))
    if goal.written:
        lanes.append(Lane(written=True))
    return lanes


def _raised(history: Sequence[Outcome], within: Sequence[Outcome], goal: Goal) -> Attempt | None:
    """Where the fastest round within the target left room under it, the round aimed
    higher by that room (it recomputes less), once per lane's aim; where that raise went
    over the target, one round between the two."""
    last = history[-1]
    # A raise that went over the target: once, one aimed lower by how far over, between
    # the two (its plan is compiled only where it still buys FASTER of the step).
    if len(history) >= 2 and not holds(last, goal) and holds(history[-2], goal):
        return _fresh(history, _lowered(last, goal), goal)
    best = within[kept(within, goal)]
    room = goal.target - _need(best, goal)
    fixed = best.attempt.lane.written  # the step as written is one plan at any aim
    if fixed or best.repeat or best.least or not best.saves or room <= SLACK * goal.target:
        return None
    raised = Attempt(best.attempt.aim + room, best.attempt.lane)
    # A higher aim keeps more, so it compiles no lower: a raise to or past an aim of its
    # lane that went over the target would go over too.
    over = [o.attempt.aim for o in history if o.attempt.lane == raised.lane and not holds(o, goal)]
    if any(best.attempt.aim < aim <= raised.aim for aim in over):
        return None
    return _fresh(history, raised, goal)


def _in_lane(history: Sequence[Outcome], lane: Lane, goal: Goal) -> Attempt | None:
    """The next round of `lane`, none of whose rounds held the target: the first at the
    target; after one over it, one aimed lower by how far over; then the least-memory
    plan, and the round after it."""
    ours = [o for o in history if o.attempt.lane == lane]
    if lane.written:  # the step as written is one plan, whatever its aim
        return None if ours else Attempt(goal.target, lane)
    if not ours:
        return Attempt(goal.target, lane)
    last, least = ours[-1], [o for o in ours if o.least]
    # Below a lane's least-memory plan no aim is lower: its rounds end there.
    if not least and not last.repeat and not _lowered_in_vain(ours, goal):
        attempt = _fresh(history, _lowered(last, goal), goal)
        if attempt is not None:
            return attempt
    if not least:
        return _fresh(history, Attempt(LEAST, lane), goal)
    lowest = min(least, key=lambda o: o.peak)
    if lowest.peak > lowest.planned_peak * (1 + SLACK):
        return _fresh(history, Attempt(lowest.peak, lane), goal)
    return None


def _lowered(last: Outcome, goal: Goal) -> Attempt:
    """The round after `last`, which went over the target, in its lane: aimed lower than
    the lesser of its aim and its plan's peak by how far over it went."""
    over = _need(last, goal) - goal.target
    return Attempt(max(LEAST, min(last.attempt.aim, last.planned_peak) - over), last.attempt.lane)


def _lowered_in_vain(ours: Sequence[Outcome], goal: Goal) -> bool:
    """Whether the last round, aimed lower because the one before it was over, peaks no
    lower: lower aims seldom do better than the least-memory plan, tried next."""
    if len(ours) < 2:
        return False
    before, last = ours[-2], ours[-1]
    return _need(before, goal) > goal.target and _need(last, goal) >= _need(before, goal)


def _fresh(history: Sequence[Outcome], attempt: Attempt, goal: Goal) -> Attempt | None:
    """`attempt`, unless a round of its lane was aimed within SAME_AIM of it."""
    close = SAME_AIM * goal.target
    for outcome in history:
        tried = outcome.attempt
        if tried.lane == attempt.lane and abs(tried.aim - attempt.aim) <= close:
            return None
    return attempt
