"""`python -m benchmarks.roofline`: the roofline's error against measured node times on this
CPU, per op family, on the model zoo.

Where nothing is measured (`measure=False`, `--no-measure`, a node that cannot run alone)
the planner takes a node's time from `planner/roofline.py`: max(FLOPs / peak, bytes moved
/ bandwidth) + a launch overhead, here from `devices.CPU`. Each zoo model's joint graph,
the one the planner profiles, is traced and profiled twice: measured on this CPU (no
profile cache, so every time is fresh) and estimated. Each node goes into an op family;
per family and per model the page gives the ratio roofline / measured, of the totals and
per node (median and quartiles), and the whole graph's step time both ways next to an
eager step's. Writes benchmarks/results/roofline-cpu.json, docs/roofline.md and
docs/img/roofline-cpu.png; `--report-only` rewrites the page and plot from the JSON.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import platform
import shlex
import sys
import warnings
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from rich.progress import track
from torch import fx
from torch.utils.flop_counter import flop_registry

from benchmarks import layout
from benchmarks.paths import ROOT
from memplan.core import devices
from memplan.core.errors import MemplanWarning
from memplan.core.files import write_atomically, write_json_atomically
from memplan.core.units import format_seconds
from memplan.planner.capture import compile_training_step
from memplan.planner.lower import drop_checked_asserts
from memplan.planner.measure import median_step_seconds
from memplan.planner.profile import profile_graph
from memplan.planner.profile_cache import device_name, node_key
from memplan.planner.roofline import MORE_FLOP_FORMULAS
from memplan.planner.views import is_view
from memplan.tools.verify import training_step
from memplan.tools.zoo import ZOO, Example

RESULTS = Path("benchmarks") / "results" / "roofline-cpu.json"
PAGE = Path("docs") / "roofline.md"
IMAGE = Path("docs") / "img" / "roofline-cpu.png"
CPU = torch.device("cpu")
# perf_counter resolves well under a microsecond, and no ATen call dispatched from Python
# takes less than one here: a node measured below this is timer noise, not kernel time.
FLOOR = 1e-6
VIEW = "view"
WORK = "all but views"
# The families whose roofline counts FLOPs, where torch's FLOP counter has a formula.
MATRIX_MATH = ("matmul", "convolution", "attention")
FAMILIES = (
    "matmul",
    "convolution",
    "attention",
    "normalization",
    "pointwise",
    "reduction",
    "copy",
    VIEW,
    "other",
)
# By overload packet name (`aten::mm` -> "mm"); families the op tags decide come after.
_MATMUL = frozenset({"mm", "addmm", "bmm", "baddbmm", "mv", "addmv", "dot"})
_CONVOLUTION = frozenset({"convolution", "convolution_backward"})
_ATTENTION_PREFIXES = ("_scaled_dot_product_", "_flash_attention", "_efficient_attention")
_NORMALIZATION_PREFIXES = (
    "native_layer_norm",
    "native_batch_norm",
    "_native_batch_norm_legit",
    "native_group_norm",
    "_fused_rms_norm",
)
# Softmax, losses and pooling reduce over a dimension or a window, though not tagged so.
_REDUCTION = frozenset(
    {"_softmax", "_softmax_backward_data", "_log_softmax", "_log_softmax_backward_data",
     "nll_loss_forward", "nll_loss_backward", "max_pool2d_with_indices",
     "max_pool2d_with_indices_backward", "avg_pool2d", "avg_pool2d_backward",
     "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward"}
)  # fmt: skip
# Ops that move or fill bytes without arithmetic (clone is tagged pointwise: checked first).
_COPY = frozenset(
    {"clone", "_to_copy", "copy", "lift_fresh_copy", "cat", "constant_pad_nd", "embedding",
     "embedding_dense_backward", "gather", "scatter", "scatter_add", "index", "index_select",
     "index_put", "slice_backward", "select_backward", "arange", "zeros", "full", "fill",
     "new_zeros", "empty", "expand_copy", "permute_copy"}
)  # fmt: skip


def family(target: object) -> str:
    """The op family of an fx node's target."""
    if not isinstance(target, torch._ops.OpOverload):
        return "other"
    name = target.name().split("::", 1)[1].split(".", 1)[0]
    if is_view(target):
        return VIEW
    if name in _MATMUL:
        return "matmul"
    if name in _CONVOLUTION:
        return "convolution"
    if name.startswith(_ATTENTION_PREFIXES):
        return "attention"
    if name.startswith(_NORMALIZATION_PREFIXES):
        return "normalization"
    if name in _COPY:
        return "copy"
    if name in _REDUCTION or torch.Tag.reduction in target.tags:
        return "reduction"
    if torch.Tag.pointwise in target.tags:
        return "pointwise"
    return "other"


@dataclass(frozen=True)
class Sample:
    """The nodes of one model's joint graph with one `node_key` (op, shapes, dtypes and
    strides): the profile measures them as one (the median over all of them), and the
    roofline of each is the same."""

    model: str
    op: str
    family: str
    nodes: int
    measured: float  # seconds, each
    roofline: float  # seconds, each


@dataclass(frozen=True)
class ModelRun:
    """One zoo model: its samples, the nodes that could not run alone (estimated, left
    out), the median seconds of an eager training step, and its ops of matrix math whose
    roofline counts no FLOPs (neither torch's FLOP counter nor the roofline's own
    formulas, roofline.MORE_FLOP_FORMULAS, have one for them)."""

    model: str
    samples: list[Sample]
    unrunnable: int
    eager_step: float
    uncounted: list[str]


class _Traced(Exception):
    """Carries the joint graph out of AOTAutograd: nothing after tracing is needed."""

    def __init__(self, joint: fx.GraphModule) -> None:
        super().__init__("traced")
        self.joint = joint


def _stop_after_tracing(joint: fx.GraphModule, joint_inputs: object, **_: object) -> object:
    raise _Traced(joint)


def joint_graph(example: Example) -> fx.GraphModule:
    """The joint forward+backward graph the planner would profile for `example`, cleaned as
    `plan.Partitioner` cleans it."""
    try:
        compile_training_step(copy.deepcopy(example.model), example.inputs, _stop_after_tracing)
    except _Traced as traced:
        joint = traced.joint
    else:
        raise AssertionError("AOTAutograd compiled without calling the partition function")
    drop_checked_asserts(joint)
    joint.graph.eliminate_dead_code()
    return joint


def run_model(name: str, example: Example, repeats: int = 5) -> ModelRun:
    """Trace, measure and estimate one model's joint graph, and time an eager step."""
    joint = joint_graph(example)
    measured = profile_graph(joint, device=CPU, repeats=repeats, cache=None, progress=False)
    with warnings.catch_warnings():
        # Roofline mode warns of ops whose transient memory has no measured bound: memory
        # is not what this benchmark is about.
        warnings.filterwarnings("ignore", "no measured bound", MemplanWarning)
        estimated = profile_graph(joint, device=CPU, measure=False, spec=devices.CPU)
    skipped = set(measured.estimated)
    groups: dict[str, list[fx.Node]] = defaultdict(list)
    for node in joint.graph.nodes:
        # Every node with tensor work gets at least the launch overhead; others get 0.
        if estimated.seconds.get(node.name, 0.0) > 0 and node.name not in skipped:
            groups[node_key(node, CPU)].append(node)
    samples = [
        Sample(
            model=name,
            op=str(nodes[0].target),
            family=family(nodes[0].target),
            nodes=len(nodes),
            measured=measured.seconds[nodes[0].name],
            roofline=estimated.seconds[nodes[0].name],
        )
        for nodes in groups.values()
    ]
    uncounted = {
        str(target)
        for target in (nodes[0].target for nodes in groups.values())
        if family(target) in MATRIX_MATH
        and target.overloadpacket not in flop_registry
        and target.overloadpacket not in MORE_FLOP_FORMULAS
    }
    step = training_step(example.model, example.inputs)
    eager = median_step_seconds(step, device=CPU, repeats=repeats)
    return ModelRun(name, samples, len(skipped), eager, sorted(uncounted))


@dataclass(frozen=True)
class Summary:
    """Roofline against measured over a set of nodes. `ratio` is of the totals; `median`,
    `q25` and `q75` are of the per-node ratio (quartiles of its log, weighted by node), and
    `under` the share of nodes whose roofline is at most their measured time, all over the
    nodes measured at FLOOR or more (`floored` were below)."""

    name: str
    nodes: int
    measured: float
    roofline: float
    ratio: float
    median: float
    q25: float
    q75: float
    under: float
    floored: int


def summarise(name: str, samples: Iterable[Sample]) -> Summary:
    samples = list(samples)
    measured = sum(s.nodes * s.measured for s in samples)
    roofline = sum(s.nodes * s.roofline for s in samples)
    timed = [s for s in samples if s.measured >= FLOOR]
    counted = sum(s.nodes for s in timed)
    if counted:
        # Ratios spread over orders of magnitude: their quartiles are taken on a log scale.
        logs = np.repeat(
            [math.log(s.roofline / s.measured) for s in timed], [s.nodes for s in timed]
        )
        q25, median, q75 = (math.exp(q) for q in np.percentile(logs, [25, 50, 75]))
        under = sum(s.nodes for s in timed if s.roofline <= s.measured) / counted
    else:
        q25 = median = q75 = under = math.nan
    nodes = sum(s.nodes for s in samples)
    ratio = roofline / measured if measured else math.nan
    return Summary(name, nodes, measured, roofline, ratio, median, q25, q75, under, nodes - counted)


def by_family(samples: list[Sample]) -> list[Summary]:
    """One Summary per family present, in FAMILIES' order, then all but views together."""
    rows = [
        summarise(f, [s for s in samples if s.family == f])
        for f in FAMILIES
        if any(s.family == f for s in samples)
    ]
    return [*rows, summarise(WORK, [s for s in samples if s.family != VIEW])]


def by_op(samples: list[Sample], top: int) -> list[Summary]:
    """One Summary per op, for the `top` ops of the most measured time."""
    ops: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        ops[s.op].append(s)
    rows = [summarise(op, chosen) for op, chosen in ops.items()]
    return sorted(rows, key=lambda r: -r.measured)[:top]


def machine() -> dict[str, Any]:
    """Where the figures were taken (benchmarks.layout's record), with the CPU's model
    name, the CPU and torch's threads as the profile cache keys times by them, and the
    load average (1 min)."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("model name")]
        model = names[0].split(":", 1)[1].strip() if names else model
    load = os.getloadavg()[0]
    return {**layout.machine(), "cpu": model, "device": device_name(CPU), "load": load}


def run(names: list[str], repeats: int = 5) -> dict[str, Any]:
    """The results of the named zoo models, as the JSON file holds them."""
    before = machine()
    runs = [run_model(n, ZOO[n](), repeats) for n in track(names, description="zoo")]
    samples = [s for r in runs for s in r.samples]
    return {
        "machine": {**before, "load_after": os.getloadavg()[0]},
        "spec": asdict(devices.CPU),
        "floor": FLOOR,
        "repeats": repeats,
        "models": [
            {"model": r.model, "unrunnable": r.unrunnable, "eager_step": r.eager_step} for r in runs
        ],
        "uncounted": sorted({op for r in runs for op in r.uncounted}),
        "families": [asdict(s) for s in by_family(samples)],
        "samples": [asdict(s) for s in samples],
    }


def _ratio(x: float) -> str:
    return "–" if math.isnan(x) else f"{x:.2f}"


def _table(rows: list[Summary], first: str) -> list[str]:
    lines = [
        f"| {first} | nodes | measured | roofline | ratio of totals | median ratio "
        "| quartiles | roofline ≤ measured |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        under = "–" if math.isnan(r.under) else f"{r.under:.0%}"
        name = f"`{r.name}`" if first == "op" else r.name
        lines.append(
            f"| {name} | {r.nodes} | {format_seconds(r.measured)} | "
            f"{format_seconds(r.roofline)} | {_ratio(r.ratio)} | {_ratio(r.median)} | "
            f"{_ratio(r.q25)}–{_ratio(r.q75)} | {under} |"
        )
    return lines


def _reading(families: list[Summary], uncounted: list[str]) -> list[str]:
    """What the family table says, in words: the scale, the spread between families (what
    a plan from estimates gets wrong), and where FLOPs went uncounted."""
    work = next(f for f in families if f.name == WORK)
    ranked = sorted(
        (f for f in families if f.name not in (WORK, VIEW) and not math.isnan(f.median)),
        key=lambda f: f.median,
    )
    short = [f"{f.name} ({_ratio(f.median)})" for f in ranked if f.median < 1]
    lines = [
        f"Over every node with work, the roofline totals {_ratio(work.ratio)} times the "
        f"measured time; the median node gets {_ratio(work.median)} times its own, and the "
        f"estimate is a lower bound on {work.under:.0%} of nodes.",
        "",
        "A plan weighs one node's time against another's (what to recompute), so the spread "
        f"between families matters more than the scale: from {ranked[0].name} at "
        f"{_ratio(ranked[0].median)} to {ranked[-1].name} at {_ratio(ranked[-1].median)} "
        f"(median ratios), a factor of {ranked[-1].median / ranked[0].median:.1f}. A plan "
        "from estimates here takes the first family for cheaper to recompute than it is, "
        "relative to the last.",
    ]
    if short:
        lines += ["", f"Families the roofline is short on (median below 1): {', '.join(short)}."]
    if uncounted:
        ops = ", ".join(f"`{op}`" for op in uncounted)
        lines += [
            "",
            f"`torch.utils.flop_counter` has no FLOP formula for {ops}: the roofline counts "
            "their bytes alone, as if they did no arithmetic.",
        ]
    return lines


def markdown(data: dict[str, Any], image: str | None) -> str:
    """docs/roofline.md from the results (with the plot at `image`, relative to the page)."""
    spec = devices.DeviceSpec(**data["spec"])
    samples = [Sample(**s) for s in data["samples"]]
    families = by_family(samples)
    m = data["machine"]
    models = [r["model"] for r in data["models"]]
    floored = sum(f.floored for f in families if f.name != WORK)
    unrunnable = sum(r["unrunnable"] for r in data["models"])
    lines = [
        "# The roofline against measured times",
        "",
        "Where nothing is measured, the planner takes a node's time from a roofline "
        "(`memplan/planner/roofline.py`): `max(FLOPs / peak, bytes moved / bandwidth) + "
        "launch overhead`, from the node's shapes alone. FLOPs are counted for matrix math "
        "only (matmuls, convolutions, attention, by `torch.utils.flop_counter`, and the CPU's "
        "fused attention by the GPU flash attention's formula, which torch's counter lacks "
        "for it), at the peak "
        "of the dtype of the node's first output; bytes are those of its tensor inputs and "
        "outputs, none for a view. It is used with `measure=False` (`--no-measure`), for a "
        "node that cannot run alone on the device, and to plan for a GPU one does not have "
        "(`PlanOptions.device_spec`, `memplan/core/devices.py`).",
        "",
        "On a GPU the specs are datasheet peaks, which no kernel exceeds, so the max() "
        "is a lower bound on a kernel's time there, short by however far the kernel falls "
        "below the peak (the launch overhead added to it is a guess); this page measures "
        "no GPU. On CPU the spec (`devices.CPU`) is no datasheet but one round guess for "
        f"any host: {spec.float32_flops / 1e9:g} GFLOP/s of matrix math in every "
        f"dtype, {spec.bandwidth / 1e9:g} GB/s of memory bandwidth and "
        f"{format_seconds(spec.launch_overhead)} per op. It can err either way; this page "
        "measures by how much, on this CPU.",
        "",
        "## How it was measured",
        "",
        f"`{data['command']}` on {m['cpu']} ({m['cpu_cores']} cores; `{m['device']}` is the "
        f"CPU and torch's threads as the profile cache names them), torch {m['torch']}, "
        f"Python {m['python']}, {m['date']}. The load average (1 min) was {m['load']:.2f} "
        f"at the start and {m['load_after']:.2f} at the end; near the number of cores or "
        "above, other work shared the machine. Models: the zoo "
        f"(`memplan/tools/zoo.py`) at its default sizes: {', '.join(models)}.",
        "",
        "Each model's joint forward+backward graph is traced as the planner traces it and "
        f"profiled by `planner/profile.py` on this CPU: the median of {data['repeats']} "
        "passes after 2 warm-up passes, each node timed around its own call (so a time "
        "includes PyTorch's dispatch from Python, a few µs), with no profile cache. Torch "
        "runs one thread unless `--threads` says otherwise: a parallel kernel waits for its "
        "slowest thread, so on a shared machine one busy core stalls the rest and times "
        "measure the neighbours more than the kernel. Nodes of one op, shapes, dtypes and "
        "strides share one measured time (the profile pools them) and one estimate. The "
        "same graph is estimated with `measure=False` and `devices.CPU`.",
        "",
        "A ratio is roofline / measured: below 1 the roofline is short (optimistic), above "
        "1 long. `ratio of totals` weighs nodes by their time; `median ratio` and its "
        "quartiles count every node alike, over nodes measured at "
        f"{format_seconds(data['floor'])} or more ({floored} below were left out of them, "
        "not of the totals). `roofline ≤ measured` is the share of nodes on which the "
        "estimate is a lower bound. Views do no work: their measured time is dispatch "
        "alone, their roofline the launch overhead (`_unsafe_view` too, a view not marked "
        "as one), and they are shown apart. "
        + (
            f"{unrunnable} node(s) could not run alone here; they are left out."
            if unrunnable
            else "Every node ran alone here."
        ),
        "",
        "## Per op family, over the zoo",
        "",
        *_table(families, "family"),
        "",
        *_reading(families, data["uncounted"]),
        "",
        "## The ops of the most measured time",
        "",
        *_table(by_op(samples, top=15), "op"),
        "",
        "## Per model: the whole graph",
        "",
        "The graph's step time as the simulator adds it up: the sum of its nodes' times, "
        "measured and estimated; and the median of "
        f"{data['repeats']} eager training steps after 2 warm-up steps, the model as it "
        "trains without memplan (module and autograd overhead included).",
        "",
        "| model | nodes | measured | roofline | ratio | eager step | roofline / eager step |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in data["models"]:
        s = summarise(r["model"], [x for x in samples if x.model == r["model"]])
        lines.append(
            f"| {r['model']} | {s.nodes} | {format_seconds(s.measured)} | "
            f"{format_seconds(s.roofline)} | {_ratio(s.ratio)} | "
            f"{format_seconds(r['eager_step'])} | {_ratio(s.roofline / r['eager_step'])} |"
        )
    present = [f.name for f in families if f.name != WORK]
    lines += [
        "",
        "## Per model and family",
        "",
        "Median ratio, and in brackets the ratio of totals.",
        "",
        f"| model | {' | '.join(present)} |",
        "|---" * (len(present) + 1) + "|",
    ]
    for model in models:
        cells = []
        for f in present:
            chosen = [x for x in samples if x.model == model and x.family == f]
            s = summarise(f, chosen) if chosen else None
            cells.append(f"{_ratio(s.median)} ({_ratio(s.ratio)})" if s else "")
        lines.append(f"| {model} | {' | '.join(cells)} |")
    if image:
        lines += [
            "",
            "## Every node",
            "",
            "One point per op and signature per model (its area grows with the nodes it "
            "stands for). On the diagonal the roofline is exact, below it short; the dashed "
            "line is the launch overhead, the least any estimate can be.",
            "",
            f"![roofline against measured times]({image})",
        ]
    return "\n".join(lines) + "\n"


def plot(data: dict[str, Any], path: Path) -> None:
    """Measured against roofline seconds, log-log, one colour per family."""
    samples = [Sample(**s) for s in data["samples"]]
    figure, axes = plt.subplots(figsize=(7, 6))
    for i, f in enumerate(FAMILIES):
        chosen = [s for s in samples if s.family == f]
        if chosen:
            axes.scatter(
                [s.measured for s in chosen],
                [s.roofline for s in chosen],
                s=[8 * math.sqrt(s.nodes) for s in chosen],
                color=plt.get_cmap("tab10")(i),
                alpha=0.3 if f == VIEW else 0.6,
                label=f,
            )
    low = min(min(s.measured, s.roofline) for s in samples)
    high = max(max(s.measured, s.roofline) for s in samples)
    axes.plot([low, high], [low, high], color="black", linewidth=0.8)
    axes.axhline(data["spec"]["launch_overhead"], color="grey", linewidth=0.8, linestyle="--")
    axes.set(
        xscale="log",
        yscale="log",
        xlabel="measured seconds",
        ylabel="roofline seconds",
        title=f"roofline against measured node times, {data['machine']['cpu']}",
    )
    axes.legend(fontsize=8)
    figure.tight_layout()
    write_atomically(path, lambda out: figure.savefig(out, format="png", dpi=110), binary=True)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(ZOO), default=list(ZOO))
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per graph")
    parser.add_argument("--threads", type=int, default=1, help="torch's CPU threads")
    parser.add_argument(
        "--out", type=Path, default=ROOT, help="root the results, page and plot go under"
    )
    parser.add_argument("--report-only", action="store_true", help="rewrite the page from JSON")
    parser.add_argument("--no-plot", action="store_true")
    args = parser.parse_args(argv)
    results, page, image = args.out / RESULTS, args.out / PAGE, args.out / IMAGE
    if args.report_only:
        data = json.loads(results.read_text())
    else:
        torch.set_num_threads(args.threads)
        data = run(args.models, args.repeats)
        command = sys.argv[1:] if argv is None else argv
        data["command"] = shlex.join(["python", "-m", "benchmarks.roofline", *command])
        write_json_atomically(results, data)
    if not args.no_plot:
        plot(data, image)
    shown = None if args.no_plot else image.relative_to(page.parent).as_posix()
    text = markdown(data, shown)
    write_atomically(page, lambda out: out.write(text))
    written = [page, *([] if args.report_only else [results]), *([] if args.no_plot else [image])]
    print("wrote " + ", ".join(str(p) for p in written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
