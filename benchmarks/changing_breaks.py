"""`python -m benchmarks.changing_breaks`: one budget across graph breaks as the batch changes.

Four parts of three checkpointed blocks (width 256, a graph break between each two;
`benchmarks.blocks.checkpointed_parts`) under one memplan backend with Inductor at an
absolute budget of 45 MiB (the step's unplanned peak at a batch of 2048 is 44.06 MiB),
trained at batches of 2048, 1536, 2048, 1024 and 2048, as a loop whose last batch of an
epoch is smaller does. At 1536 Dynamo compiles the graphs again with a dynamic batch
(runner.py): each graph is then checked against what the graphs before it hold at
the batch they ran at, and a graph over its share leaves the later ones room at that
batch, as a graph of static shapes does (room.py). At each batch two steps run as a
user runs them (they compile and plan; inside the allocator's recording their compiles
could not read the allocator), and the allocator reads a third, against the step's
prediction at that batch (`backend.predicted_step_peak`). Gradients: the largest
absolute difference from eager's at each batch.

A second series trains a fresh compile as a loop whose epoch ends in one smaller batch
does (2048, 2048, 2048, 1536, three times), and the allocator reads every step, those that
compile and plan included; a step counts as planning where the backend made a plan in it.
Writes benchmarks/results/changing-breaks-<device>.json and its section of docs/results.md.
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable
from typing import Any

import torch
from rich.progress import track

import memplan
from benchmarks.blocks import checkpointed_parts
from benchmarks.graph_breaks import grad_error
from benchmarks.models import machine
from benchmarks.pages import ResultsSection
from memplan.compile.backend import MemplanBackend
from memplan.core.errors import MemplanWarning
from memplan.core.units import format_bytes
from memplan.planner.measure import measure_peak
from memplan.tools.verify import resident_tensors, training_step

BUDGET = 45 * 2**20
BATCHES = (2048, 1536, 2048, 1024, 2048)
EPOCHS = (2048, 2048, 2048, 1536) * 3
CPU = torch.device("cpu")


def measure() -> dict[str, Any]:
    return {
        "machine": machine("cpu"),
        "budget": BUDGET,
        "steps": _changing_batches(),
        "epochs": _epochs(),
    }


def _compiled() -> tuple[
    torch.nn.Module, MemplanBackend, Callable[..., Any], tuple[torch.Tensor, torch.Tensor]
]:
    """The four parts (the module trained), their backend, their compile and the batch."""
    model, batch = checkpointed_parts(4)
    torch._dynamo.reset()
    backend = memplan.backend(budget=BUDGET, progress=False)
    return model, backend, torch.compile(model, backend=backend), batch


def _changing_batches() -> list[dict[str, Any]]:
    """BATCHES, two unmeasured steps and one measured at each."""
    model, backend, compiled, (x, y) = _compiled()
    eager = copy.deepcopy(model)
    steps = []
    for batch in track(BATCHES, description="changing breaks"):
        inputs = (x[:batch], y[:batch])
        step = training_step(compiled, inputs)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", MemplanWarning)
            for _ in range(2):
                step()
                model.zero_grad(set_to_none=True)
        peak = measure_peak(step, resident=resident_tensors(model, inputs), device=CPU)
        eager.zero_grad(set_to_none=True)
        training_step(eager, inputs)()
        steps.append(
            {
                "batch": batch,
                "peak": peak.peak_bytes,
                "predicted_peak": backend.predicted_step_peak,
                "warnings": len(said),
                "max_grad_error": grad_error(model, eager),
                "plans": [p.name for p in backend.ledger.step.values()],
            }
        )
    return steps


def _epochs() -> list[dict[str, Any]]:
    """EPOCHS, every step measured: its peak, its prediction, whether it planned."""
    model, backend, compiled, (x, y) = _compiled()
    steps = []
    for batch in track(EPOCHS, description="epochs"):
        inputs = (x[:batch], y[:batch])
        plans = len(backend.plans)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always", MemplanWarning)
            step = training_step(compiled, inputs)
            peak = measure_peak(step, resident=resident_tensors(model, inputs), device=CPU)
        model.zero_grad(set_to_none=True)
        steps.append(
            {
                "batch": batch,
                "peak": peak.peak_bytes,
                "predicted_peak": backend.predicted_step_peak,
                "planned": len(backend.plans) > plans,
                "warnings": len(said),
            }
        )
    return steps


def section_text(saved: dict[str, Any]) -> str:
    """The section of docs/results.md."""
    where, budget = saved["machine"], saved["budget"]
    lines = [
        "## One budget across graph breaks as the batch changes",
        "",
        f"Written by `python -m benchmarks.changing_breaks` ({where['date']}, "
        f"{where['device_name']}, {where['cpu_threads']} threads, torch {where['torch']}): "
        "four checkpointed parts with a graph break between each two under one memplan "
        f"backend with Inductor at {format_bytes(budget)}, the batch changing between "
        "steps; from the first smaller batch Dynamo compiles the graphs with a dynamic "
        "batch. Peak: the allocator's, of the third step at each batch (the first two "
        "plan and compile); predicted: the step's at that batch; warnings: memplan's, in "
        "the first two steps. Plans: each graph's plan in the step at that batch.",
        "",
        "| batch | peak | predicted | within | warnings | plans | max grad error |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in saved["steps"]:
        lines.append(
            f"| {s['batch']} | {format_bytes(s['peak'])} | {format_bytes(s['predicted_peak'])} "
            f"| {'yes' if s['peak'] <= budget else 'no'} | {s['warnings']} | "
            f"{'; '.join(s['plans'])} | {s['max_grad_error']:.1e} |"
        )
    if "epochs" in saved:
        lines += _epochs_text(saved["epochs"], budget)
    return "\n".join(lines) + "\n"


def _epochs_text(epochs: list[dict[str, Any]], budget: int) -> list[str]:
    """The lines of the epochs series."""
    lines = [
        "",
        "As a loop whose epoch ends in one smaller batch (a fresh compile; every step read by "
        "the allocator, those that plan included):",
        "",
        "| step | batch | peak | predicted | within | planned in the step | warnings |",
        "|---|---|---|---|---|---|---|",
    ]
    for index, s in enumerate(epochs, 1):
        lines.append(
            f"| {index} | {s['batch']} | {format_bytes(s['peak'])} | "
            f"{format_bytes(s['predicted_peak'])} | {'yes' if s['peak'] <= budget else 'no'} | "
            f"{'yes' if s['planned'] else 'no'} | {s['warnings']} |"
        )
    return lines


SECTION = ResultsSection("changing breaks", __doc__.splitlines()[0], measure, section_text)


if __name__ == "__main__":
    raise SystemExit(SECTION.main())
