"""`python -m benchmarks.training_loop`: an ordinary training loop whose shapes change,
under torch.compile's default and under memplan's backend.

GPT-2 from the zoo (the head-to-head's layers and width, benchmarks.models.SIZES) trains
for `--steps` steps (30) of a plain loop: SGD, zero_grad, forward, loss.backward, step.
The batch size cycles through the preset's batches and, every full cycle, the sequence
length moves to the next of its lengths; the last step of every epoch takes a smaller
batch, as the end of a data set does. The loop runs twice, on copies of one model and on
the same batches: under `torch.compile(model)` (inductor) and under
`torch.compile(model, backend=memplan.backend(budget=B, inner="inductor"))`, B an absolute
budget: `--share` (50%) of eager's peak at the largest shape, read by the allocator first.
The default is below torch.compile's own peak there (62% of eager's in the run of
2026-11-24), so that the budget asks memplan for memory that torch.compile does not save.

Each loop runs twice on the same compiled model. First as a user runs it: per step, its
wall time, how many graphs Dynamo compiled and memplan planned in it, the loss, the
exception if it raised (recorded; the loop goes on with the next step) and the warnings
memplan gave. Then, the parameters put back and the same batches drawn again, each step
is read by the allocator (measure_peak) on the code the first pass compiled: a step that
compiles measured inside the allocator's recording would count what compiling allocates,
and memplan cannot read the allocator (its profile, its check of Inductor's graphs) inside
that recording. Per run: compile time, recompiles, memplan's plans. Writes
benchmarks/results/training-loop-<device>.json, docs/img/training_loop.png and the section
of docs/results.md between MARKERS (`training_loop_section` gives the same text to
benchmarks.models' results_markdown).
Run: `python -m benchmarks.training_loop [--help]`; a smoke run (its figures are no
results): `python -m benchmarks.training_loop --sizes small --steps 6 --out /tmp/smoke`.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from rich.console import Console
from rich.progress import Progress
from torch import nn

import memplan
from benchmarks.compiled import (
    Outputs,
    command_line,
    compiled_graphs,
    one_line,
    sizes_of,
)
from benchmarks.pages import saved_section, write_section
from benchmarks.paths import RESULTS
from memplan.core.errors import MemplanWarning
from memplan.core.files import write_json_atomically
from memplan.core.units import format_bytes, format_seconds
from memplan.planner.measure import measure_peak
from memplan.tools.verify import resident_tensors, steady_step_peak
from memplan.tools.zoo import ZOO

MODEL = "gpt2"
LEARNING_RATE = 1e-3
INDUCTOR, MEMPLAN = "torch.compile", "memplan"
# The section of docs/results.md this benchmark owns (see benchmarks/compiled.py).
MARKERS = ("<!-- training loop: start -->", "<!-- training loop: end -->")


@dataclass(frozen=True)
class Loop:
    """The shapes a loop cycles through: batch sizes, sequence lengths, and the smaller
    batch that ends each epoch of `epoch` steps."""

    batches: tuple[int, ...]
    seqs: tuple[int, ...]
    last_batch: int
    epoch: int

    def shapes(self, steps: int) -> list[tuple[int, int]]:
        """(batch, seq) of each step."""
        found = []
        for step in range(steps):
            batch = self.batches[step % len(self.batches)]
            seq = self.seqs[step // len(self.batches) % len(self.seqs)]
            if step % self.epoch == self.epoch - 1:
                batch = self.last_batch
            found.append((batch, seq))
        return found


# "bench": the largest shape is the head-to-head's GPT-2 (batch 8, seq 256).
LOOPS = {
    "bench": Loop(batches=(8, 6, 4), seqs=(256, 192, 128), last_batch=3, epoch=10),
    "small": Loop(batches=(2, 3), seqs=(32, 16), last_batch=1, epoch=5),
}


@dataclass(frozen=True)
class Step:
    """One step of the loop: its shape and what it cost, or the exception it raised."""

    step: int
    batch: int
    seq: int
    peak: int | None  # the allocator's, in bytes; None where the step raised
    seconds: float
    compiled: int  # graphs Dynamo compiled in the step (0: it ran compiled code)
    loss: float | None
    error: str | None = None
    warnings: list[str] = field(default_factory=list)  # memplan's, in order
    # Plans memplan made in the step: one per graph Dynamo compiled, and more where the
    # backend plans a graph of dynamic shapes again for new sizes without a recompile.
    planned: int = 0
    # Graphs compiled and plans made in the measured run of the step (0 where the first
    # pass compiled all the loop needs; else its peak counts compiling too). A measured
    # step that compiled is run again from where it started, and only that run counts.
    compiled_when_measured: int = 0

    @property
    def compiling(self) -> bool:
        """Whether the step compiled or planned anything (its time is not a steady step's)."""
        return bool(self.compiled or self.planned)


def build(preset: str) -> tuple[nn.Module, int]:
    """The zoo's GPT-2, positions for the longest sequence, and its vocabulary size."""
    loop, sizes = LOOPS[preset], sizes_of(MODEL, preset)
    example = ZOO[MODEL](
        batch=max(loop.batches), seq=max(loop.seqs), layers=sizes["layers"], width=sizes["width"]
    )
    return example.model, example.model.model.config.vocab_size


def eager_peak(base: nn.Module, ids: torch.Tensor) -> int:
    """The allocator's peak of an eager forward and backward (no optimizer step) on `ids`,
    on a copy of `base`: the loops start from its parameters, with no gradients."""
    model = copy.deepcopy(base)
    return steady_step_peak(model, model, (ids, ids))


def train(
    base: nn.Module,
    compile_: Callable[[nn.Module], nn.Module],
    plans: Callable[[], int],
    shapes: list[tuple[int, int]],
    vocab: int,
    advance: Callable[[Step], None],
) -> list[Step]:
    """The loop on a fresh copy of `base`, compiled afresh by `compile_`, twice: as a user
    runs it, then from the same parameters and batches again with each step read by the
    allocator; `plans()` counts the plans memplan has made."""
    torch._dynamo.reset()
    model = copy.deepcopy(base)
    compiled = compile_(model)
    passes: list[list[Step]] = []
    for measured in (False, True):
        # In place: the compiled graphs' guards on the parameters still hold.
        model.load_state_dict(base.state_dict())
        optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
        generator = torch.Generator().manual_seed(0)  # both runs see the same batches
        steps = []
        for index, (batch, seq) in enumerate(shapes):
            ids = torch.randint(0, vocab, (batch, seq), generator=generator)
            # Where a measured step must run again, it starts from these parameters.
            before = copy.deepcopy(model.state_dict()) if measured else None
            step = one_step(index, compiled, model, optimizer, ids, plans, measured)
            if before is not None and step.compiling:
                # Dynamo may try a graph of dynamic shapes before the static one compiled
                # for these sizes, and memplan plan it for them: that measured nothing
                # but compiling. The step runs again from where it started.
                model.load_state_dict(before)
                again = one_step(index, compiled, model, optimizer, ids, plans, measured)
                step = replace(again, compiled_when_measured=again.compiled + again.planned)
            steps.append(step)
            advance(step)
        passes.append(steps)
    timed, read = passes
    return [
        replace(
            first,
            peak=again.peak,
            error=first.error or again.error,
            compiled_when_measured=again.compiled_when_measured,
        )
        for first, again in zip(timed, read, strict=True)
    ]


def one_step(
    index: int,
    compiled: nn.Module,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    ids: torch.Tensor,
    plans: Callable[[], int],
    measured: bool,
) -> Step:
    """One step of the loop, timed, or read by the allocator where `measured` (its peak;
    its time is then the recording's too); an exception is recorded, not raised."""
    # Before the step, not inside it: last step's gradients freed inside would read as
    # frees of memory the step never allocated.
    optimizer.zero_grad(set_to_none=True)
    losses: list[torch.Tensor] = []

    def step() -> None:
        loss = compiled(ids, ids)  # the zoo's GPT-2 takes (input_ids, labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())

    before, planned = compiled_graphs(), plans()
    started = time.perf_counter()
    peak, error = None, None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if measured:
                peak = measure_peak(
                    step, resident=resident_tensors(model, (ids,)), device=ids.device
                ).peak_bytes
            else:
                step()
        except Exception as failure:
            error = one_line(failure)
    return Step(
        step=index,
        batch=ids.shape[0],
        seq=ids.shape[1],
        peak=peak,
        seconds=time.perf_counter() - started,
        compiled=compiled_graphs() - before,
        loss=losses[0].item() if losses else None,
        error=error,
        warnings=[str(w.message) for w in caught if issubclass(w.category, MemplanWarning)],
        planned=plans() - planned,
    )


def totals(steps: list[Step], budget: int) -> dict[str, Any]:
    """A run's totals. compile_seconds: what the steps that compiled or planned took beyond
    a step of their shape that did neither (the median of those, or of all such steps where
    the shape never ran without compiling); crashed steps' time is failed_seconds."""
    ran = [s for s in steps if s.error is None]
    steady = [s for s in ran if not s.compiling]
    overall = statistics.median(s.seconds for s in steady) if steady else 0.0

    def steady_time(shape: tuple[int, int]) -> float:
        same = [s.seconds for s in steady if (s.batch, s.seq) == shape]
        return statistics.median(same) if same else overall

    peaks = [s.peak for s in ran if s.peak is not None]
    return {
        "crashed": len(steps) - len(ran),
        "graphs_compiled": sum(s.compiled for s in steps),
        # Graphs compiled after the first step: Dynamo meeting a shape its graphs' guards
        # reject (it then compiles one with symbolic sizes, or a new static one).
        "recompiles": sum(s.compiled for s in steps[1:]),
        "plans": sum(s.planned for s in steps),
        "compile_seconds": sum(
            s.seconds - steady_time((s.batch, s.seq)) for s in ran if s.compiling
        ),
        "failed_seconds": sum(s.seconds for s in steps if s.error is not None),
        "steady_median_seconds": overall if steady else None,
        "max_peak": max(peaks, default=None),
        "steps_over_budget": sum(1 for p in peaks if p > budget),
        "warnings": sum(len(s.warnings) for s in steps),
    }


def run_loops(preset: str, steps: int, share: float, progress: Progress) -> dict[str, Any]:
    """Eager's peak at the largest shape, then the loop under each compiler."""
    loop = LOOPS[preset]
    base, vocab = build(preset)
    largest = torch.randint(0, vocab, (max(loop.batches), max(loop.seqs)))
    peak = eager_peak(base, largest)
    budget = int(share * peak)
    shapes = loop.shapes(steps)
    task = progress.add_task("training", total=2 * 2 * steps)  # two runs, two passes each
    # Offload as by default: on where the device is not the host.
    backend = memplan.backend(budget=budget, inner="inductor", progress=False)
    # Per run: how it compiles the model, and how many plans memplan has made.
    compilers: dict[str, tuple[Callable[[nn.Module], nn.Module], Callable[[], int]]] = {
        INDUCTOR: (torch.compile, lambda: 0),
        MEMPLAN: (lambda model: torch.compile(model, backend=backend), lambda: len(backend.plans)),
    }
    runs = {}
    for name, (compile_, plans) in compilers.items():

        def advance(step: Step, name: str = name) -> None:
            if step.error:
                state = "crashed"
            else:
                state = "timed" if step.peak is None else format_bytes(step.peak)
            label = f"{name}: step {step.step} ({step.batch}x{step.seq}) {state}"
            progress.update(task, advance=1, description=label)

        with empty_caches():
            found = train(base, compile_, plans, shapes, vocab, advance)
        runs[name] = {"steps": [asdict(s) for s in found], "totals": totals(found, budget)}
    runs[MEMPLAN]["plans"] = [
        {"budget": p.budget, "predicted_peak": p.peak, "status": p.status, "note": p.note}
        for p in backend.plans
    ]
    return {
        "sizes": preset,
        "loop": asdict(loop),
        "steps": steps,
        "share": share,
        "eager_peak": peak,
        "budget": budget,
        "caches": "empty",
        "runs": runs,
    }


@contextlib.contextmanager
def empty_caches() -> Iterator[None]:
    """Inductor's on-disk caches (AOTAutograd's among them) and memplan's, empty, for what
    runs inside: a loop's compile time is then a first run's, whatever earlier runs on
    the machine left."""
    names = ("TORCHINDUCTOR_CACHE_DIR", "MEMPLAN_CACHE_DIR")
    before = {name: os.environ.get(name) for name in names}
    with tempfile.TemporaryDirectory() as root:
        os.environ.update({name: os.path.join(root, name.lower()) for name in names})
        try:
            yield
        finally:
            for name, value in before.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


# --- the report --------------------------------------------------------------------------


def plot(saved: dict[str, Any], path: Path) -> None:
    """Each step's peak under both compilers against the budget; compiling steps hollow,
    crashed steps an x on the budget line."""
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for (name, run), colour in zip(saved["runs"].items(), ("tab:blue", "tab:red"), strict=True):
        steps = [Step(**s) for s in run["steps"]]
        ran = [s for s in steps if s.peak is not None]
        axes.plot(
            [s.step for s in ran],
            [s.peak / 2**20 for s in ran],
            "-",
            color=colour,
            alpha=0.5,
            label=name,
        )
        for compiling, face in ((False, colour), (True, "none")):
            chosen = [s for s in ran if s.compiling == compiling]
            axes.scatter(
                [s.step for s in chosen],
                [s.peak / 2**20 for s in chosen],  # type: ignore[operator]
                edgecolors=colour,
                facecolors=face,
                s=30,
                zorder=3,
            )
        crashed = [s.step for s in steps if s.error is not None]
        if crashed:
            axes.scatter(
                crashed,
                [saved["budget"] / 2**20] * len(crashed),
                marker="x",
                color=colour,
                s=50,
                zorder=4,
                label=f"{name}: crashed",
            )
    budget = f"memplan's budget ({saved['share']:.0%} of eager's largest)"
    for level, line_colour, style, label in (
        (saved["budget"], "tab:red", "--", budget),
        (saved["eager_peak"], "0.5", ":", "eager at the largest shape"),
    ):
        axes.axhline(level / 2**20, color=line_colour, linestyle=style, linewidth=1, label=label)
    shapes = [f"{s['batch']}x{s['seq']}" for s in saved["runs"][INDUCTOR]["steps"]]
    axes.set_xticks(range(len(shapes)), shapes, rotation=90, fontsize=6)
    axes.set_xlabel("step (batch x sequence length); hollow: the step compiled or planned")
    axes.set_ylabel("peak by the allocator (MiB)")
    axes.set_title("GPT-2, a training loop of changing shapes under torch.compile")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="best")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def section_text(saved: dict[str, Any]) -> str:
    """The docs section (without its markers) from the saved JSON."""
    where, loop = saved["machine"], saved["loop"]
    lines = [
        "## A training loop of changing shapes under torch.compile",
        "",
        f"Written by `python -m benchmarks.training_loop` ({where['date']}, "
        f"{saved['sizes']} sizes, {where['device_name']}, {where['cpu_threads']} threads, "
        f"torch {where['torch']}); the raw figures are in "
        f"`benchmarks/results/training-loop-{where['device']}.json`.",
        "",
        f"GPT-2 trains for {saved['steps']} steps of a plain loop (SGD, zero_grad, forward, "
        f"backward, step), the batch cycling through {_listed(loop['batches'])} and the "
        f"sequence length through {_listed(loop['seqs'])}, the last of every "
        f"{loop['epoch']} steps a batch of {loop['last_batch']}. Once under "
        "`torch.compile(model)` (inductor) and once under `torch.compile(model, "
        'backend=memplan.backend(budget=B, inner="inductor"))`, B = '
        f"{format_bytes(saved['budget'])}, {saved['share']:.0%} of eager's peak at the "
        f"largest shape ({format_bytes(saved['eager_peak'])}); an absolute budget holds "
        "each graph Dynamo hands over. Both take Dynamo's default for shapes: a step of a "
        "shape the compiled graphs' guards reject compiles again (with symbolic sizes, "
        "once a size has changed). Each loop runs twice on the same compiled model: "
        "first as a user runs it (each step's wall time, what it compiled, its loss "
        "and memplan's warnings), then from the same parameters and batches again, "
        "each step read by the allocator on the code the first pass compiled (its "
        "peak: a step measured while it compiles would count what compiling "
        "allocates, and memplan cannot read the allocator inside that recording). "
        "Compile time: what the steps that compiled or planned took beyond the median "
        "step of their shape that did neither, "
        + (
            "each loop starting from empty on-disk caches (Inductor's and memplan's: a "
            "first run's)."
            if saved.get("caches") == "empty"
            else "with the on-disk caches as earlier runs left them."
        ),
        "",
        "| run | crashed steps | graphs compiled | recompiles | memplan's plans | "
        "compile time | time of crashed steps | median step | largest peak | "
        "steps over B | memplan's warnings |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [_totals_row(name, run["totals"]) for name, run in saved["runs"].items()]
    lines += ["", *_findings(saved), ""]
    lines += ["![The training loop's peak per step](img/training_loop.png)", ""]
    lines += _steps_table(saved)
    return "\n".join(lines) + "\n"


def _listed(values: list[int]) -> str:
    return ", ".join(str(v) for v in values)


def _totals_row(name: str, t: dict[str, Any]) -> str:
    median = t["steady_median_seconds"]
    return (
        f"| {name} | {t['crashed']} | {t['graphs_compiled']} | {t['recompiles']} | "
        f"{t['plans']} | "
        f"{t['compile_seconds']:.1f} s | {t['failed_seconds']:.1f} s | "
        f"{'-' if median is None else f'{median * 1e3:.0f} ms'} | "
        f"{'-' if t['max_peak'] is None else format_bytes(t['max_peak'])} | "
        f"{t['steps_over_budget']} | {t['warnings']} |"
    )


def _findings(saved: dict[str, Any]) -> list[str]:
    """memplan's plans, the exceptions and warnings (each once, with its steps), and how
    far the two runs' losses are apart."""
    plans = saved["runs"][MEMPLAN].get("plans", [])
    lines = [
        f"- memplan made {len(plans)} plan{'' if len(plans) == 1 else 's'} in both passes"
        + (
            ": "
            + "; ".join(
                f"predicted {format_bytes(p['predicted_peak'])} at budget "
                f"{format_bytes(p['budget'])} ({p['status']})"
                for p in plans
            )
            if plans
            else ""
        )
        + "."
    ]
    for name, run in saved["runs"].items():
        steps = [Step(**s) for s in run["steps"]]
        for kind, texts in (
            ("raised", [(s.step, s.error) for s in steps if s.error]),
            ("warned", [(s.step, w) for s in steps for w in s.warnings]),
        ):
            for text, count in Counter(t for _, t in texts).items():
                at = [str(i) for i, t in texts if t == text]
                lines.append(f"- {name} {kind} at step {', '.join(at)} ({count}x): {text}")
    both = zip(*(run["steps"] for run in saved["runs"].values()), strict=True)
    apart = [
        abs(a["loss"] - b["loss"])
        for a, b in both
        if a["loss"] is not None and b["loss"] is not None
    ]
    if apart:
        lines.append(
            f"- Losses of the steps both runs took ({len(apart)}): at most {max(apart):.1e} apart."
        )
    return lines


def _steps_table(saved: dict[str, Any]) -> list[str]:
    """Each step under both compilers: peak and time, * where it compiled."""
    names = list(saved["runs"])
    lines = [
        "| step | shape | " + " | ".join(f"{n} peak | {n} time" for n in names) + " |",
        "|---|---|" + "---|---|" * len(names),
    ]
    columns = [[Step(**s) for s in saved["runs"][n]["steps"]] for n in names]
    for row in zip(*columns, strict=True):
        cells = [str(row[0].step), f"{row[0].batch} x {row[0].seq}"]
        for s in row:
            mark = " *" if s.compiling else ""
            peak = "crashed" if s.error is not None else format_bytes(s.peak or 0) + mark
            cells += [peak, format_seconds(s.seconds)]
        lines.append("| " + " | ".join(cells) + " |")
    again = sum(s.compiled_when_measured for column in columns for s in column)
    return [
        *lines,
        "",
        "\\* the step compiled (Dynamo compiled a graph, or memplan planned one, in it), "
        "in the first pass. A step that compiled when it ran again to be measured ran a "
        "third time from where it started; graphs compiled or planned in the runs "
        f"measured: {again}.",
        "",
    ]


def training_loop_section(where: dict[str, Any], results: Path = RESULTS) -> list[str]:
    """The section for docs/results.md with its markers, where this benchmark has run on
    `where`'s device; benchmarks.models' results_markdown adds it to the page."""
    return saved_section(results / f"training-loop-{where['device']}.json", section_text, *MARKERS)


def write_report(saved: dict[str, Any], outputs: Outputs) -> None:
    """The plot, and this benchmark's section of the page (the rest of the page stays)."""
    plot(saved, outputs.image("training_loop.png"))
    outputs.page.parent.mkdir(parents=True, exist_ok=True)
    write_section(outputs.page, section_text(saved), *MARKERS)


def _options(parser: argparse.ArgumentParser) -> None:
    """This benchmark's own options, between --sizes and --out."""
    parser.add_argument("--steps", type=int, default=30, help="steps of each loop")
    parser.add_argument(
        "--share", type=float, default=0.5, help="memplan's budget: this share of eager's peak"
    )


def main(argv: list[str] | None = None) -> None:
    parsed = command_line(
        argparse.ArgumentParser(description=__doc__.splitlines()[0]),
        argv,
        sizes_help="bench: the head-to-head's GPT-2 and LOOPS['bench']; small: a smoke run "
        "(needs --out)",
        options=_options,
        out_help="write the JSON, plot and page here, not into the repository",
        stem="training-loop",
        report=write_report,
    )
    if parsed is None:
        return
    args, outputs, where, path = parsed
    console = Console()
    with Progress(console=console) as progress:
        saved = {"machine": where, **run_loops(args.sizes, args.steps, args.share, progress)}
    write_json_atomically(path, saved)
    write_report(saved, outputs)
    crashed = sum(run["totals"]["crashed"] for run in saved["runs"].values())
    console.print(f"wrote {path}, {outputs.page} and training_loop.png; {crashed} steps crashed")


if __name__ == "__main__":
    main()
