"""memplan's exception tree (every error a user can cause is one of these), its warning,
and how an error is shown in one line."""

from __future__ import annotations

from memplan.core.units import format_bytes


class MemplanError(Exception):
    """Base of every error memplan raises on bad input."""


class BudgetError(MemplanError, ValueError):
    """A budget that is zero, negative, not a number or cannot be parsed."""


class InfeasibleBudget(MemplanError):
    """No schedule found fits the budget; `smallest_feasible` is the least peak found
    (`what` says which: the live "peak", or the "arena" of the plan's layout).
    `lower_bound`, where known, is a peak no schedule can go below: above the budget, it
    proves the budget infeasible; else the budget is only unmet by the solvers."""

    def __init__(
        self,
        budget: int,
        smallest_feasible: int,
        solver: str,
        *,
        what: str = "peak",
        lower_bound: int | None = None,
    ) -> None:
        self.budget = budget
        self.smallest_feasible = smallest_feasible
        self.solver = solver
        self.what = what
        self.lower_bound = lower_bound
        message = (
            f"budget {format_bytes(budget)} ({budget} B) is below the smallest feasible {what} "
            f"{format_bytes(smallest_feasible)} ({smallest_feasible} B) found by {solver!r}"
        )
        if lower_bound is not None:
            bound = f"{format_bytes(lower_bound)} ({lower_bound} B)"
            if self.proved:
                message += f"; proved infeasible: no schedule peaks below {bound}"
            else:
                message += f"; no schedule found, not proved infeasible (lower bound {bound})"
        super().__init__(message)

    @property
    def proved(self) -> bool:
        """Whether the lower bound proves that no schedule meets the budget."""
        return self.lower_bound is not None and self.lower_bound > self.budget


class GraphError(MemplanError, ValueError):
    """A malformed Graph or graph file (cycles, missing fields, unknown ids)."""


class InvalidSchedule(MemplanError):
    """The simulator rejected a schedule: a missing input, a bad transfer or over budget."""


class UnsupportedModel(MemplanError):
    """The model cannot be planned; the message names the node and why."""

    def __init__(self, node: str, reason: str) -> None:
        self.node = node
        self.reason = reason
        super().__init__(f"cannot plan node {node!r}: {reason}")


class ModelFileError(MemplanError):
    """A model file that is missing, corrupt or would need unpickling to load."""


class PlanFileError(MemplanError):
    """A plan file that is missing, corrupt or does not match the model."""


class UnknownSolver(MemplanError, KeyError):
    """A solver name the registry does not know."""

    def __str__(self) -> str:
        return str(self.args[0])


class UnknownOption(MemplanError, TypeError):
    """A keyword option an entry point does not take (the message names those it does)."""


class MissingDependency(MemplanError, ImportError):
    """An optional library a solver needs is not installed."""


class UnsupportedProblem(MemplanError):
    """A solver was asked for a problem it does not solve (training vs general)."""


class AllocatorUnreadable(MemplanError):
    """The CPU allocator's events cannot be read here: another torch.profiler session is
    recording, and a second one started inside it would end the first and lose its events."""


class OutputFileError(MemplanError):
    """An output path that cannot be written: a folder, or under a file."""


class MemplanWarning(UserWarning):
    """A warning memplan gives: a plan that holds only in part (a best-effort budget)."""


class InfeasibleBudgetWarning(MemplanWarning):
    """A budget under the least the planner finds, planned for that least instead (best
    effort): the warning InfeasibleBudget becomes where best effort is allowed."""


def one_line(error: BaseException | str) -> str:
    """The error's message with its whitespace folded onto one line."""
    text = " ".join(str(error).split())
    return text or (error if isinstance(error, str) else type(error).__name__)


def first_line(error: BaseException, limit: int = 300) -> str:
    """The first line of an error's message, cut at `limit` characters: torch's run on
    for a page."""
    lines = str(error).strip().splitlines()
    text = one_line(lines[0]) if lines else type(error).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def cause_of(error: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The first exception of `kind` among `error` and its causes: torch.compile raises
    what a backend raised inside its own BackendCompilerFailed (as `inner_exception`), so
    memplan's InfeasibleBudget from a compiling step is `cause_of(error, InfeasibleBudget)`."""
    found: BaseException | None = error
    while found is not None and not isinstance(found, kind):
        found = found.__cause__ or getattr(found, "inner_exception", None)
    return found
