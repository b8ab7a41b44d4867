"""The largest batch that trains under a memory cap, for eager, PyTorch's partitioner and
memplan, each within a step-time overhead limit.

The cap is enforced for real: on a GPU by torch.cuda.set_per_process_memory_fraction, on
CPU by the allocator's record of the step, which raises torch.OutOfMemoryError where its
peak passed the cap. A batch fits a method when one training step runs under the cap
and its time per sample is at most (1 + overhead limit) times eager's time per sample at
eager's largest batch (eager itself has no overhead limit). The search finds the largest
batch that runs under the cap, then the largest within the overhead limit below it.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from memplan.core.budget import Budget
from memplan.core.errors import InfeasibleBudget, MemplanError
from memplan.planner.allocator import recording
from memplan.planner.measure import median_step_seconds, resident_bytes
from memplan.planner.module import plan_module
from memplan.planner.options import PlanOptions
from memplan.tools.batch_search import DEFAULT_OVERHEAD, METHODS, MaxBatch, Probe, search
from memplan.tools.compare import PYTORCH_BUDGETS, pytorch_partitioned
from memplan.tools.verify import resident_tensors, training_step
from memplan.tools.zoo import ZOO, Example

# A model and example inputs for a batch size (memplan.tools.zoo's builders, partially applied).
Builder = Callable[[int], tuple[nn.Module, tuple[Any, ...]]]


def builder(spec: str) -> Builder:
    """The model builder `spec` names: a memplan.tools.zoo model, or MODULE:FUNCTION, a function
    taking batch=N that returns a memplan.tools.zoo.Example or a (model, inputs) pair."""
    if ":" in spec:
        module_name, _, function_name = spec.partition(":")
        try:
            function = getattr(importlib.import_module(module_name), function_name)
        except (ImportError, AttributeError) as error:
            raise MemplanError(f"cannot load {spec!r}: {error}") from None
    elif spec in ZOO:
        function = ZOO[spec]
    else:
        raise MemplanError(
            f"unknown model {spec!r}: a zoo model ({', '.join(sorted(ZOO))}) or MODULE:FUNCTION"
        )

    def build(batch: int) -> tuple[nn.Module, tuple[Any, ...]]:
        made = function(batch=batch)
        if isinstance(made, Example):
            return made.model, made.inputs
        if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module):
            return made[0], tuple(made[1])
        raise MemplanError(
            f"{spec} returned {type(made).__name__}, not an Example or (model, inputs)"
        )

    return build


def max_batch(
    build: Builder,
    cap_bytes: int,
    methods: Sequence[str] = METHODS,
    *,
    overhead: float = DEFAULT_OVERHEAD,
    solver: str = "greedy",
    start: int = 1,
    limit: int = 1 << 16,
    time_limit: float = 30.0,
    repeats: int = 5,
    on_probe: Callable[[str, Probe], None] | None = None,
) -> list[MaxBatch]:
    """The largest batch under `cap_bytes` for each of `methods` ("eager", "pytorch",
    "memplan"). Eager runs first: its time per sample at its largest batch is what the
    others' overhead is measured against; `overhead=math.inf` sets no step-time limit."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise MemplanError(f"unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
    if cap_bytes <= 0 or not 1 <= start <= limit:
        raise MemplanError(f"need a positive cap and 1 <= start <= limit, got {cap_bytes}, {start}")
    if not overhead >= 0:  # NaN fails this too
        raise MemplanError(f"overhead limit must be a non-negative number, got {overhead}")
    trial = _Trial(build, cap_bytes, solver, time_limit, repeats)
    eager = search("eager", trial.eager, cap_bytes, start, limit, on_probe)
    results = [eager] if "eager" in methods else []
    if eager.batch == 0 or eager.step_seconds is None:
        per_sample = math.inf  # nothing to compare with: no overhead limit
    else:
        per_sample = eager.step_seconds / eager.batch
    trial.allowed_per_sample = per_sample * (1 + overhead)
    for method in (m for m in methods if m != "eager"):
        attempt = trial.pytorch if method == "pytorch" else trial.memplan
        first = max(start, eager.batch)
        results.append(search(method, attempt, cap_bytes, first, limit, on_probe))
    return results


class _Trial:
    """Runs one method at one batch size under the cap."""

    def __init__(
        self, build: Builder, cap_bytes: int, solver: str, time_limit: float, repeats: int
    ) -> None:
        self.build = build
        self.cap_bytes = cap_bytes
        self.solver = solver
        self.time_limit = time_limit
        self.repeats = repeats
        self.allowed_per_sample = math.inf

    def eager(self, batch: int) -> Probe:
        model, inputs = self.build(batch)
        return self._run(batch, model, model, inputs, "")

    def pytorch(self, batch: int) -> Probe:
        """The fastest of PyTorch's activation memory budgets that fits."""
        model, inputs = self.build(batch)
        tried = []
        for budget in PYTORCH_BUDGETS:
            module = pytorch_partitioned(model, inputs, budget)
            tried.append(self._run(batch, model, module, inputs, f"activation budget {budget:.1f}"))
        # The fastest that fits; else the fastest that ran under the cap (too slow); else
        # the first refusal.
        ran = [p for p in tried if p.step_seconds is not None]
        if not ran:
            return Probe(batch, False, reason=tried[0].reason)
        return min(ran, key=lambda p: (not p.fits, p.step_seconds))

    def memplan(self, batch: int) -> Probe:
        model, inputs = self.build(batch)
        options = PlanOptions(solver=self.solver, time_limit=self.time_limit, progress=False)
        try:
            planned = plan_module(model, inputs, Budget(bytes=self.cap_bytes), options)
        except InfeasibleBudget as error:
            return Probe(batch, False, reason=f"no plan: {error}")
        return self._run(batch, model, planned, inputs, self.solver)

    def _run(
        self, batch: int, model: nn.Module, module: nn.Module, inputs: tuple[Any, ...], setting: str
    ) -> Probe:
        """One step of `module` under the cap, then its median time if it fit."""
        step = training_step(module, inputs)
        device = next(model.parameters()).device
        try:
            with capped(self.cap_bytes, resident_tensors(model, inputs), device):
                step()
        except torch.OutOfMemoryError as error:
            return Probe(batch, False, setting, reason=str(error).splitlines()[0])
        finally:
            for p in model.parameters():
                p.grad = None
        seconds = median_step_seconds(step, device=device, repeats=self.repeats, warmup=1)
        for p in model.parameters():
            p.grad = None
        if seconds / batch > self.allowed_per_sample:
            reason = f"{seconds / batch * 1e3:.2f} ms per sample is over the overhead limit"
            return Probe(batch, False, setting, seconds, reason)
        return Probe(batch, True, setting, seconds)


@contextlib.contextmanager
def capped(
    cap_bytes: int, resident: Sequence[torch.Tensor], device: torch.device
) -> Iterator[None]:
    """Device memory limited to `cap_bytes` inside the block: torch.OutOfMemoryError above.

    On CUDA the caching allocator's per-process fraction. On CPU, where nothing limits the
    allocator, the block runs under the allocator's record and raises afterwards if its
    peak (the resident bytes plus the most allocated above them) passed the cap: the step
    is deterministic, so a step that went over the cap is one that would have run out."""
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), device)
        try:
            yield
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0, device)
        return
    with recording(device) as recorded:
        yield
    peak = resident_bytes(resident, device) + recorded.peak_above_start()
    if peak > cap_bytes:
        raise torch.OutOfMemoryError(
            f"memplan: the step's allocator peak {peak} B is above the cap of {cap_bytes} B"
        )
