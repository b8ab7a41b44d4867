"""`make demo`: plan a small GPT-2 at 50% of its unplanned peak, train a few steps, and
compare eager with planned: predicted peak, measured peak and step time."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

import memplan
from memplan.core.units import format_bytes
from memplan.planner.measure import measure_peak, median_step_seconds
from memplan.tools.report import plot_timeline
from memplan.tools.verify import resident_tensors
from memplan.tools.zoo import gpt2

OUT = Path("out")
STEPS = 5


def main() -> None:
    console = Console()
    example = gpt2()
    cpu = torch.device("cpu")
    eager = copy.deepcopy(example.model)
    console.print("[bold]memplan demo[/]: GPT-2 (4 layers, random weights), batch 8 x 128 tokens")
    planned = memplan.optimize(example.model, example.inputs, budget="50%")
    plan = planned.plan

    rows = []
    for label, module in (("eager", eager), ("memplan 50%", planned)):
        optimizer = torch.optim.SGD(module.parameters(), lr=1e-3)

        def step(
            module: torch.nn.Module = module, optimizer: torch.optim.Optimizer = optimizer
        ) -> None:
            optimizer.zero_grad(set_to_none=True)
            module(*example.inputs).backward()

        resident = resident_tensors(module, example.inputs)
        peak = measure_peak(step, resident=resident, device=cpu).peak_bytes
        seconds = median_step_seconds(step, device=cpu, repeats=STEPS)
        losses = []
        for _ in range(STEPS):
            step()
            optimizer.step()
            losses.append(float(module(*example.inputs).detach()))
        rows.append((label, peak, seconds, losses[-1]))

    table = Table(title=f"one training step on {cpu}")
    for column in ("run", "budget", "predicted peak", "measured peak", "step time", "loss after"):
        table.add_column(column, justify="right")
    predicted = {"eager": plan.unplanned_peak, "memplan 50%": plan.predicted_peak}
    budgets = {"eager": "-", "memplan 50%": format_bytes(plan.budget)}
    for label, peak, seconds, loss in rows:
        table.add_row(
            label,
            budgets[label],
            format_bytes(predicted[label]),
            format_bytes(peak),
            f"{seconds * 1e3:.1f} ms",
            f"{loss:.4f}",
        )
    console.print(table)
    console.print(f"decisions: {plan.counts()}; solver {plan.solver} in {plan.solve_seconds:.2f} s")
    OUT.mkdir(exist_ok=True)
    png = OUT / "demo_timeline.png"
    plot_timeline(plan, png, measured_peak=rows[1][1])
    console.print(f"memory timeline: {png}")


if __name__ == "__main__":
    main()
