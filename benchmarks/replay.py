"""`python -m benchmarks.replay`: memplan carrying out a torch.compile point's decisions.

Where memplan's matched plan is slower than a torch.compile point, is it memplan's
decisions or how memplan carries them out?

For each model and `activation_memory_budget` of CASES (the zoo at the head-to-head's
sizes, benchmarks.models.SIZES), three runs, each compiled afresh on a copy of the model
as benchmarks.compiled compiles its runs:
- torch.compile (inductor) at that budget, its partitioner watched: the values its
  backward receives are what it saves;
- memplan's backend (inductor inside) at the point's measured peak, as an absolute budget:
  the head-to-head's "matched" run;
- memplan's backend carrying out the point's own decisions (`backend(reuse=...)`): each
  tensor memplan's plan decides on is kept where torch.compile saves its storage (itself,
  or the storage it is a view of) and recomputed where not. The planned graph is memplan's
  own (its rewrite, its order), so this run differs from the point only in how memplan
  carries the decisions out.

The two memplan runs are timed head to head against a twin of the point, compiled beside
them (benchmarks.compiled's `Compiled._head_to_head`: the median over 11 pairs timed back
to back). Per run: the allocator's peak of a steady step, what it recomputes and the
gradients' distance from eager's. Writes benchmarks/results/replay-<device>.json and that
device's section of docs/measurement.md (between `markers(device)`), or both into
`--out DIR`. The models train on CUDA where it is available (`--device`). Run it alone:
step times on a shared machine are noise.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
import torch._functorch.config  # set below; `import torch` alone does not load it
import torch._inductor.compile_fx as compile_fx
from rich.progress import track
from torch import fx

from benchmarks.compiled import (
    Compiled,
    CompiledRun,
    Outputs,
    add_device_option,
    least_pairs,
    measurement_command_line,
    sizes_of,
)
from benchmarks.models import Bench
from benchmarks.pages import write_section
from memplan.core.errors import MemplanError
from memplan.core.files import write_json_atomically
from memplan.core.units import format_bytes
from memplan.planner.plan_file import Plan
from memplan.planner.views import is_view
from memplan.tools.zoo import ZOO

PAGE = "measurement.md"
# Per device, (model, torch.compile's activation_memory_budget): the points memplan's
# matched run was slowest against in the head-to-head there (benchmarks/results/
# compiled-cpu.json of 2026-11-28; compiled-cuda.json, on an H200, of 2026-11-27).
CASES = {"cpu": ("cnn:0.8", "resnet50:0.6"), "cuda": ("gpt2:0.2",)}
REPEATS = 5  # as benchmarks.compiled's default; the head to head takes 2 * 5 + 1 pairs
SOLVER = "greedy"
TIME_LIMIT = 60.0  # seconds per solve, as the head-to-head of 2026-11-28
# The replayed run's budget: the decisions are fixed, and the budget only what the
# compiled graphs are checked against; no plan comes near it.
REPLAY_BUDGET = 1 << 50


@dataclasses.dataclass
class Saved:
    """What torch.compile's partitioner saved for the backward: each saved value's name
    and the root of every value of the joint graph (the value it is a view of, through
    views; itself where it is none)."""

    names: set[str] = dataclasses.field(default_factory=set)
    roots: dict[str, str] = dataclasses.field(default_factory=dict)


@contextlib.contextmanager
def watched_partitioner() -> Iterator[Saved]:
    """Inside: Inductor's partitioner records what it saves. Inductor's and AOTAutograd's
    caches are off, or a cached compile would skip the partitioner."""
    saved = Saved()
    partition = compile_fx.min_cut_rematerialization_partition

    def watched(joint: fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        forward, backward = partition(joint, *args, **kwargs)
        saved.roots = {n.name: _root(n).name for n in joint.graph.nodes}
        saved.names = {
            n.name
            for n in backward.graph.find_nodes(op="placeholder")
            if not n.name.startswith("tangents")
        }
        return forward, backward

    with (
        torch._functorch.config.patch(enable_autograd_cache=False),
        torch._inductor.config.patch(fx_graph_cache=False),
        mock.patch.object(compile_fx, "min_cut_rematerialization_partition", watched),
    ):
        yield saved


def _root(node: fx.Node) -> fx.Node:
    while node.op == "call_function" and is_view(node.target) and node.args:
        base = node.args[0]
        if not isinstance(base, fx.Node):
            break
        node = base
    return node


def torch_decisions(plan: Plan, saved: Saved) -> tuple[dict[str, str], list[str]]:
    """`plan`'s decisions made as torch.compile made them: keep what it saves, recompute the
    rest; and the names memplan decides on that torch.compile's graph lacks (a copy
    memplan's rewrite added: recomputed)."""
    unknown = sorted(name for name in plan.decisions if name not in saved.roots)
    saved_storages = {saved.roots.get(name, name) for name in saved.names}
    decisions = {
        name: "keep" if saved.roots.get(name) in saved_storages else "recompute"
        for name in plan.decisions
    }
    return decisions, unknown


def described(run: CompiledRun, plan: Plan | None = None) -> dict[str, Any]:
    """What the page shows of `run` (and of its plan); a run that failed fails the
    benchmark."""
    if not run.measured:
        raise MemplanError(f"{run.method} {run.setting}: {run.status}")
    shown: dict[str, Any] = {
        "measured_peak": run.measured_peak,
        "raw_step_seconds": run.raw_step_seconds,
        "max_grad_error": run.max_grad_error,
    }
    if plan is not None:
        shown |= {
            "recomputed": sorted(n for n, d in plan.decisions.items() if d == "recompute"),
            "kept": sorted(n for n, d in plan.decisions.items() if d == "keep"),
            "predicted_peak": plan.peak,
            "predicted_seconds": plan.predicted_time,
            "against_ratio": run.against_ratio,
        }
    return shown


def replay(model: str, budget: float, preset: str, device: str) -> dict[str, Any]:
    """One case: the three runs of the module docstring, at the sizes of `preset`."""
    sizes = sizes_of(model, preset)
    bench = Bench(ZOO[model](**sizes).to(device), REPEATS, TIME_LIMIT)
    # The least pairs per head-to-head (least_pairs): a case must fit a short GPU call.
    runner = Compiled(bench, SOLVER, TIME_LIMIT, head_to_head_seconds=0.0)
    runner.eager()
    with watched_partitioner() as saved:
        point = runner.pytorch(budget)
    setting = point.setting
    if not saved.names:
        raise MemplanError(f"{model}: torch.compile's partitioner was not seen")
    matched = runner.memplan(f"matched {setting}", point.measured_peak or 0, against=setting)
    (template,) = runner.plans or [None]
    if template is None:
        raise MemplanError(f"{model}: memplan's matched run: {matched.status}")
    decisions, unknown = torch_decisions(template, saved)
    reuse = dataclasses.replace(template, decisions=decisions)
    replayed = runner.memplan(f"{setting}'s decisions", REPLAY_BUDGET, against=setting, reuse=reuse)
    (applied,) = runner.plans or [None]
    return {
        "model": model,
        "point": setting,
        "sizes": sizes,
        "torch": described(point),
        "matched": described(matched, template),
        "replayed": described(replayed, applied),
        "not_in_torch_graph": unknown,
    }


def case(text: str) -> tuple[str, float]:
    """A case as given: "model:budget" (cnn:0.8)."""
    model, _, budget = text.partition(":")
    if model not in ZOO or not budget:
        raise argparse.ArgumentTypeError(f"{text!r}: give model:budget, a model of the zoo")
    return model, float(budget)


def markdown(data: dict[str, Any]) -> str:
    """The section of docs/measurement.md (without its markers)."""
    where = data["machine"]
    lines = [
        f"## torch.compile's decisions, carried out by memplan, on {where['device_name']}",
        "",
        f"Written by `python -m benchmarks.replay` ({where['date']}, {where['device_name']}, "
        f"{where['cpu_threads']} threads, torch {where['torch']}); the raw figures are in "
        f"`benchmarks/results/replay-{where['device']}.json`. Per case: torch.compile at one "
        "activation memory budget; memplan's backend at that point's measured peak "
        "(\"matched\"); and memplan's backend carrying out the point's own decisions "
        "(`memplan.backend(reuse=...)`: kept where the point saves, recomputed where not). "
        "Step time: the median over "
        f"{least_pairs(data['repeats'])} pairs of the run's step over a twin of the point's, "
        "compiled beside it and timed back to back.",
        "",
    ]
    for case in data["cases"]:
        point, matched, replayed = case["torch"], case["matched"], case["replayed"]
        lines += [
            f"### {case['model']} against torch.compile {case['point']}",
            "",
            "Sizes: " + ", ".join(f"{k} {v}" for k, v in case["sizes"].items()) + ".",
            "",
            "| run | measured peak | predicted | recomputed | step time vs the point "
            "| max grad error |",
            "|---|---|---|---|---|---|",
            f"| torch.compile {case['point']} | {format_bytes(point['measured_peak'])} | - | - "
            f"| x1 | {point['max_grad_error']:.1e} |",
        ]
        runs = (("memplan matched", matched), ("memplan, the point's decisions", replayed))
        for label, run in runs:
            lines.append(
                f"| {label} | {format_bytes(run['measured_peak'])} | "
                f"{format_bytes(run['predicted_peak'])} | {len(run['recomputed'])} | "
                f"x{run['against_ratio']:.3f} | {run['max_grad_error']:.1e} |"
            )
        only_matched = sorted(set(matched["kept"]) - set(replayed["kept"]))
        only_point = sorted(set(replayed["kept"]) - set(matched["kept"]))
        lines += [
            "",
            f"- Kept by memplan's matched plan, not by torch.compile: "
            f"{', '.join(only_matched) or 'none'}.",
            f"- Kept by torch.compile, not by memplan's matched plan: "
            f"{', '.join(only_point) or 'none'}.",
            f"- memplan's predicted step time: {matched['predicted_seconds'] * 1e3:.1f} ms for "
            f"its matched plan, {replayed['predicted_seconds'] * 1e3:.1f} ms for the point's "
            "decisions.",
        ]
        if case["not_in_torch_graph"]:
            lines.append(
                "- Not in torch.compile's graph (recomputed in the replay): "
                + ", ".join(case["not_in_torch_graph"])
                + "."
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def markers(device: str) -> tuple[str, str]:
    return (f"<!-- replay {device}: start -->", f"<!-- replay {device}: end -->")


def write_report(data: dict[str, Any], outputs: Outputs) -> None:
    """The device's section of docs/measurement.md (or of --out's measurement.md)."""
    page = outputs.docs / PAGE
    write_section(page, markdown(data), *markers(data["machine"]["device"]))


def _options(parser: argparse.ArgumentParser) -> None:
    add_device_option(parser)
    parser.add_argument(
        "--cases",
        nargs="+",
        type=case,
        default=None,
        help="model:budget pairs (default per device: "
        + "; ".join(f"{d}: {' '.join(c)}" for d, c in CASES.items())
        + ")",
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parsed = measurement_command_line(parser, argv, _options, "replay", write_report)
    if parsed is None:
        return
    args, outputs, where, path = parsed
    cases = args.cases or [case(c) for c in CASES[args.device]]
    data = {
        "machine": where,
        "repeats": REPEATS,
        "cases": [
            replay(model, budget, args.sizes, args.device)
            for model, budget in track(cases, description="replaying torch's decisions")
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomically(path, data)
    write_report(data, outputs)
    print(f"wrote {path} and {outputs.docs / PAGE}")


if __name__ == "__main__":
    main()
