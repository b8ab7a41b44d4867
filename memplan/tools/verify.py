"""Check a plan on the real model: one planned training step against one eager step.

A plan's predicted peak is a number a user launches a job on, so it is worth one step to
confirm: the planned step's gradients must equal eager's, and its peak, read from the
allocator (what an out-of-memory error counts), must be within the budget and within 2%
of the prediction. `memplan plan --verify` and the benchmarks run
this; it is also the API for checking a plan before a long job.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from memplan.core.budget import Budget
from memplan.core.errors import MemplanError
from memplan.planner.measure import measure_peak, own_random_numbers
from memplan.planner.module import plan_module
from memplan.planner.options import PlanOptions
from memplan.planner.peak_contents import LiveBlocks, live_at_peak
from memplan.planner.plan_file import Plan

# Gradients of a recomputed graph are bit-identical in practice; the tolerance only absorbs
# kernels that pick a different reduction order between runs.
GRAD_RTOL = 1e-5
GRAD_ATOL = 1e-6
DEFAULT_TOLERANCE = 0.02  # measured peak vs predicted, as a fraction of the prediction
_COMPARED_SEED = 0  # the eager and the planned step compared both start from it
_SCHEDULE_OPTIONS = (
    "offload",
    "bandwidth",
    "offload_threshold",
    "measure",
    "convolution_copies",
)


@dataclass(frozen=True)
class Verification:
    """One planned step measured next to one eager step."""

    budget: int
    predicted_peak: int
    measured_peak: int  # by the allocator: what an out-of-memory error counts
    eager_peak: int
    method: str  # how the peaks were read: "allocator" on CPU, "cuda" on a GPU
    max_grad_error: float  # largest absolute difference from eager's gradients
    grads_match: bool
    tolerance: float
    # The planned step's peak by the live-storage tracker, which sees only the tensors ops
    # return: a diagnostic. The allocator's excess over it is kernels' own buffers.
    tracker_peak: int = 0
    # Where the check failed: what the planned step held at its peak, by size and by where
    # it was allocated, the largest first (planner/peak_contents.py), read on one more step.
    at_peak: tuple[LiveBlocks, ...] = ()

    @property
    def kernel_buffers(self) -> int:
        """Bytes at the planned peak that only the allocator sees (workspaces, copies)."""
        return max(0, self.measured_peak - self.tracker_peak) if self.tracker_peak else 0

    @property
    def prediction_error(self) -> float:
        """(measured - predicted) / predicted."""
        return self.measured_peak / self.predicted_peak - 1 if self.predicted_peak else 0.0

    @property
    def within_budget(self) -> bool:
        return self.measured_peak <= self.budget

    @property
    def ok(self) -> bool:
        return (
            self.grads_match and self.within_budget and abs(self.prediction_error) <= self.tolerance
        )

    def problems(self) -> list[str]:
        """What failed, one sentence each (empty when `ok`)."""
        found = []
        if not self.grads_match:
            found.append(f"gradients differ from eager's by up to {self.max_grad_error:.3g}")
        if not self.within_budget:
            found.append(
                f"measured peak {self.measured_peak} B is above the budget {self.budget} B"
            )
        if abs(self.prediction_error) > self.tolerance:
            found.append(
                f"measured peak {self.measured_peak} B is {self.prediction_error:+.1%} from "
                f"the predicted {self.predicted_peak} B (tolerance {self.tolerance:.0%})"
            )
        return found


def verify(
    model: nn.Module,
    example_inputs: Sequence[Any],
    plan: Plan,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
) -> Verification:
    """Run one eager and one planned training step of `model(*example_inputs)` (a loss, or
    outputs that are summed into one) and compare them.

    The two compared steps start from one seed: the planned forward runs its random ops
    (dropout) in eager's order, so both draw the same masks. The model's parameters,
    buffers and gradients, and the random number generators, are as before when this
    returns. Raises PlanFileError if `plan` was made for another model.
    """
    device = _device_of(model, example_inputs)
    # Both steps run on `model` itself, from the same state, which is restored afterwards:
    # a deep copy would not do, as it can untie weights that share storage.
    state = {k: t.detach().clone() for k, t in model.state_dict(keep_vars=True).items()}
    grads = {n: p.grad for n, p in model.named_parameters()}
    resident = resident_tensors(model, example_inputs)
    # The user's random numbers are left as they were; inside, the two compared steps
    # start from one seed, so that a model with dropout draws the same masks in both.
    with own_random_numbers(device) as seed:
        try:
            _reset(model, state)
            # One unmeasured step first, for eager and planned alike: a first step also sets up
            # what later steps reuse (cuBLAS's workspace on a GPU), which is not the plan's.
            training_step(model, example_inputs)()
            _reset(model, state)
            seed(_COMPARED_SEED)
            eager_peak = measure_peak(
                training_step(model, example_inputs), resident=resident, device=device
            )
            eager_grads = {n: p.grad for n, p in model.named_parameters()}
            _reset(model, state)
            # The options that shape the graph and the schedule are the plan's own.
            same = {k: plan.options[k] for k in _SCHEDULE_OPTIONS if k in plan.options}
            options = PlanOptions(solver=plan.solver, progress=False, **same)
            planned = plan_module(
                model, example_inputs, Budget(bytes=plan.budget), options, reuse=plan
            )
            training_step(planned, example_inputs)()
            _reset(model, state)
            seed(_COMPARED_SEED)
            measured = measure_peak(
                training_step(planned, example_inputs), resident=resident, device=device
            )
            error, match = compare_grads(model, eager_grads)
            _reset(model, state)
            tracked = measure_peak(
                training_step(planned, example_inputs),
                resident=resident,
                device=device,
                method="tracker",
            )
            check = Verification(
                budget=plan.budget,
                predicted_peak=plan.predicted_peak,  # the number in the plan, not a fresh one
                measured_peak=measured.peak_bytes,
                eager_peak=eager_peak.peak_bytes,
                method=measured.method,
                max_grad_error=error,
                grads_match=match,
                tolerance=tolerance,
                tracker_peak=tracked.peak_bytes,
            )
            if not check.ok:
                _reset(model, state)
                held = live_at_peak(training_step(planned, example_inputs), device)
                check = dataclasses.replace(check, at_peak=tuple(held))
        finally:
            _reset(model, state)
            for name, param in model.named_parameters():
                param.grad = grads[name]
    return check


def training_step(model: nn.Module, inputs: Sequence[Any]) -> Callable[[], None]:
    """One forward and backward of `model(*inputs)`: a loss, or outputs summed into one."""

    def step() -> None:
        out = model(*inputs)
        if not isinstance(out, torch.Tensor):
            raise MemplanError(
                f"verify needs the model to return a tensor, got {type(out).__name__}"
            )
        (out if out.ndim == 0 else out.sum()).backward()

    return step


def steady_step_peak(run: nn.Module, model: nn.Module, inputs: Sequence[Any]) -> int:
    """The peak of one training step of `run` (which trains `model`'s parameters), read by
    measure_peak (the allocator) after one unmeasured step: a first step sets up what later
    steps reuse. The measured step's gradients are left on the parameters."""
    training_step(run, inputs)()
    for param in model.parameters():
        param.grad = None
    step = training_step(run, inputs)
    resident = resident_tensors(model, inputs)
    return measure_peak(step, resident=resident, device=_device_of(model, inputs)).peak_bytes


def resident_tensors(model: nn.Module, inputs: Sequence[Any]) -> list[torch.Tensor]:
    """What is on the device before a step starts: parameters, buffers and tensor inputs."""
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    return [*model.parameters(), *model.buffers(), *tensors]


def _device_of(model: nn.Module, inputs: Sequence[Any]) -> torch.device:
    for t in [*model.parameters(), *(x for x in inputs if isinstance(x, torch.Tensor))]:
        return t.device
    return torch.device("cpu")


def _reset(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Put `state` back into the model's own tensors and clear its gradients."""
    with torch.no_grad():
        for key, tensor in model.state_dict(keep_vars=True).items():
            tensor.copy_(state[key])
    for param in model.parameters():
        param.grad = None


def compare_grads(model: nn.Module, expected: dict[str, torch.Tensor | None]) -> tuple[float, bool]:
    """The largest absolute gradient difference from `expected`, and whether all are allclose."""
    worst, match = 0.0, True
    for name, param in model.named_parameters():
        want = expected[name]
        if (param.grad is None) != (want is None):
            return float("inf"), False
        if param.grad is None or want is None:
            continue
        worst = max(worst, (param.grad - want).abs().max().item())
        match &= torch.allclose(param.grad, want, rtol=GRAD_RTOL, atol=GRAD_ATOL)
    return worst, match
