"""`python -m benchmarks.llm_gpu`: memplan against PyTorch's ways of saving activation
memory, on a Llama-3.2-1B-shaped decoder trained with AdamW on one GPU (issue 72).

The model is benchmarks/configs/llama-1b.json (hidden 2048, intermediate 8192, 32 heads,
8 KV heads, vocabulary 128,256) with 4 of its 16 layers, random weights, in bf16,
trained in mixed precision: fp32 master weights, the fp32 gradients they are updated
from and AdamW's two fp32 moments, 16 bytes per parameter held all step beside the bf16
weights, which is the step `memplan plan --hf-config --dtype bf16` plans
(memplan/core/training_state.py). Every step is a forward, a backward and an optimizer
step on one fixed batch of random tokens. Methods, in the order they run (the most
important first, so that a cut-off campaign keeps them):
- no_ac: `torch.compile(model)`, nothing checkpointed;
- full_ac: transformers' `gradient_checkpointing_enable` (use_reentrant=False), compiled
  (with transformers 5.25 Dynamo breaks the graph at every layer, on a context variable
  set inside it, and runs the layers' checkpoints around compiled pieces: what a user
  gets);
- memplan_at_full_ac: `memplan.backend` at full_ac's measured peak, offloading off;
- memplan_offload: `memplan.backend` at OFFLOAD_SHARE of full_ac's peak, offloading on,
  at the host link measured on the machine;
- torch_compile_budget: torch.compile with `activation_memory_budget` COMPILE_BUDGET;
- torch_offload: full_ac with the saved tensors in pinned host memory
  (`torch.autograd.graph.save_on_cpu`);
- fit_prediction: `memplan plan --hf-config` of the same config on fake tensors (no GPU,
  the target's roofline) at FIT_SHARE of the device's memory, its plan then carried out
  on the device by `memplan.optimize(reuse=...)`, or planned again there where the plan
  names tensors the device's trace lacks (its attention kernel is the CPU's).
memplan's backend plans the graphs the step compiles, told the optimizer: it counts the
16 bytes per parameter outside them (AdamW's moments as its first step makes them, the
masters and their gradients as held), and its prediction is the backend's predicted step
peak, which holds them (`outside_bytes`: what it counted).

Each method runs in a process of its own with empty caches, so that its first step (the
compile included: `compile_s`, from the method's setup on, the fit's command line too)
is a first run's and an out-of-memory error stays its own; each is bounded by
METHOD_SECONDS and all by --time-limit, and its log is kept. Per run:
the peak of the step after the first (torch.cuda.reset_peak_memory_stats, then
max_memory_allocated; on CPU the allocator's events, memplan.planner.measure), tokens per
second over the median of the size's `steps` steps after it, and every step's loss. The
JSON (OUT/llm-gpu.json, written after each method), the TARGETS met or not, a plot of
peak against tokens per second and the section of DOCS/results.md.

The gpu size has 4 layers, not 16: Dynamo unrolls the layers into one graph, so each
compile grows with them (Inductor's first step of the tiny widths, on a 2-core CPU
shared with other work: 60, 82 and 131 s at 2, 4 and 8 layers), six methods compile
anew, memplan's backend compiles each graph more than once (compile/rounds.py) after
profiling every node, and the campaign must fit one 10-minute call with its process
starts and model builds (about 15 s each). At 4 layers torch.compile's first step is
estimated at 30 s on the H100's host (GPT-2 at 6 layers took 18-23 s on the H200,
docs/gpu.md), and the campaign at about 450 s. The batch fills the device: at 4,096
tokens the eager step's graph holds HEAD_BYTES_PER_TOKEN for the loss (the logits, their
fp32 copy and log-softmax) and LAYER_BYTES_PER_TOKEN per layer, and the batch is the
most sequences under EAGER_SHARE of the device's memory (8 on an H100, 15 on an H200);
Inductor fuses the loss, so no_ac's peak is well below that: an estimated 40% of the
device's memory.
Run: `benchmarks/llm_gpu.sh OUTDIR` on the GPU, then, back in the repository, copy
OUTDIR/llm-gpu.json into benchmarks/results/ and write the page from it with
`python -m benchmarks.llm_gpu --report-only benchmarks/results/llm-gpu.json`. On the
CPU, the tiny size, a few layers of small width in float32 (its figures are no results;
`--inner eager` for a run of seconds): `python -m benchmarks.llm_gpu --sizes tiny --out
/tmp/tiny`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import torch._functorch.config  # set below; `import torch` alone does not load it
from torch import nn

from benchmarks.models import machine
from benchmarks.pages import write_section
from benchmarks.paths import DOCS, RESULTS, ROOT
from memplan.core.errors import MemplanWarning, PlanFileError, one_line
from memplan.core.files import write_json_atomically
from memplan.core.training_state import TrainingState
from memplan.core.units import format_bytes
from memplan.planner.measure import measure_peak, median_step_seconds

CONFIG = ROOT / "benchmarks" / "configs" / "llama-1b.json"
# The methods, in the order they run; each key is a function of METHODS below.
ORDER = (
    "no_ac",
    "full_ac",
    "memplan_at_full_ac",
    "memplan_offload",
    "torch_compile_budget",
    "torch_offload",
    "fit_prediction",
)
# Each method's wall-clock bound, its process's start and first step included (on an H100
# a process imports torch and transformers and builds the model in about 15 s): more than
# the estimate, so that a slow compile still ends, the first methods the most.
METHOD_SECONDS = {
    "machine": 60,
    "no_ac": 150,
    "full_ac": 150,
    "memplan_at_full_ac": 200,
    "memplan_offload": 200,
    "torch_compile_budget": 120,
    "torch_offload": 120,
    "fit_prediction": 150,
}
TIME_LIMIT = 510.0  # the whole campaign, so that it ends within 9 minutes
COMPILE_BUDGET = 0.5  # torch_compile_budget's activation_memory_budget
OFFLOAD_SHARE = 0.8  # memplan_offload's budget, of full_ac's peak
FIT_SHARE = 0.8  # fit_prediction's budget, of the device's memory
EAGER_SHARE = 0.9  # the eager step's estimated peak the batch is chosen for
LEARNING_RATE = 1e-4
# The eager step of the 1B-shaped decoder in bf16 at 4,096 tokens, from `memplan plan
# --hf-config` on fake tensors at 4 and 8 layers, batch 1 and 2 (2026-12-05): bytes per
# token of the loss head and of each layer, and per parameter of what the step holds
# whatever the batch (bf16 weights, and 16 bytes outside the graph).
HEAD_BYTES_PER_TOKEN = 1_555_468
LAYER_BYTES_PER_TOKEN = 108_680
BYTES_PER_PARAMETER = 18
PARAMETERS = {"embedding": 128256 * 2048, "layer": 60_821_504}
# Targets (docs/results.md reports each).
FASTER_AT_FULL_AC = 1.10  # memplan at full_ac's peak, its tokens/s over full_ac's
OVER_BUDGET = 0.1 * 2**30  # bytes a run may peak above its budget
OFFLOAD_SPEED = 0.95  # memplan_offload's tokens/s, of full_ac's
PREDICTED = 0.02  # memplan's predicted peak, from the measured one
FIT_PREDICTED = 0.05  # fit_prediction's
COMPILE_SLOWER = 1.3  # memplan's compile time over torch.compile's (no_ac)
LINK_BYTES = 256 * 2**20  # one copy of the host link's measurement
MARKERS = ("<!-- llm_gpu: begin -->", "<!-- llm_gpu: end -->")
RESULT = "llm-gpu.json"
PLOT = "img/llm_gpu.png"


@dataclass(frozen=True)
class Size:
    """The decoder and its step: the layers kept of the config, overrides of its widths,
    the tokens per sequence, sequences per step (0: chosen from the device's memory by
    `batch_for`), the dtype's name (memplan's: "bf16", "fp32"), the steps measured after
    the first two, and the fit's budget ("" for FIT_SHARE of the device's memory)."""

    layers: int
    seq: int
    batch: int
    dtype: str
    steps: int
    widths: dict[str, int] = field(default_factory=dict)
    fit_budget: str = ""


SIZES = {
    "gpu": Size(layers=4, seq=4096, batch=0, dtype="bf16", steps=5),
    "tiny": Size(
        layers=2,
        seq=64,
        batch=2,
        dtype="fp32",
        steps=2,
        widths={
            "hidden_size": 64,
            "intermediate_size": 256,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "vocab_size": 512,
            "max_position_embeddings": 256,
        },
        fit_budget="70%",
    ),
}


def write_config(size: Size, path: Path) -> Path:
    """The config of `size` (llama-1b.json with its layers and widths), written at `path`
    for the methods' processes and the fit's command line to read."""
    config = {**json.loads(CONFIG.read_text()), "num_hidden_layers": size.layers, **size.widths}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def batch_for(memory: int, size: Size) -> int:
    """The most sequences whose eager step, as estimated from the fit on fake tensors,
    stays within EAGER_SHARE of `memory` bytes (at least 1)."""
    parameters = PARAMETERS["embedding"] + size.layers * PARAMETERS["layer"]
    per_sequence = size.seq * (HEAD_BYTES_PER_TOKEN + size.layers * LAYER_BYTES_PER_TOKEN)
    room = EAGER_SHARE * memory - BYTES_PER_PARAMETER * parameters
    return max(1, int(room // per_sequence))


# --- one method, in a process of its own -----------------------------------------------


class MixedPrecisionAdamW:
    """AdamW on fp32 master weights: each step copies the gradients into fp32 and the
    updated masters back into the model's weights (in fp32, the weights are their own
    masters). Everything it holds exists from its construction but AdamW's moments,
    made at its first step: `outside` counts them too, as the fit does, and `tensors` once
    they are made."""

    def __init__(self, params: list[nn.Parameter]) -> None:
        self.params = params
        mixed = any(p.dtype != torch.float32 for p in params)
        self.masters = [p.detach().float() for p in params] if mixed else params
        if mixed:
            for master in self.masters:
                master.grad = torch.zeros_like(master)
        self.adamw = torch.optim.AdamW(self.masters, lr=LEARNING_RATE, fused=True)
        state = TrainingState(sum(p.numel() for p in params), "adamw", mixed_precision=mixed)
        self.outside = state.outside  # bytes held outside the graph, as the fit counts them

    def tensors(self) -> list[torch.Tensor]:
        """What it holds: the masters, their gradients and AdamW's state."""
        grads = [m.grad for m in self.masters if m.grad is not None]
        state = [t for s in self.adamw.state.values() for t in s.values() if torch.is_tensor(t)]
        return [*self.masters, *grads, *state]

    def step(self) -> None:
        if self.masters is not self.params:
            for param, master in zip(self.params, self.masters, strict=True):
                master.grad.copy_(param.grad)
                param.grad = None
        self.adamw.step()
        if self.masters is self.params:
            self.adamw.zero_grad(set_to_none=True)
            return
        with torch.no_grad():
            for param, master in zip(self.params, self.masters, strict=True):
                param.copy_(master)


@dataclass
class Setup:
    """How a method trains: the module a step calls, whether the step's saved tensors go to
    host memory, torch._functorch.config settings while it runs, memplan's backend, and
    the step's budget in bytes."""

    run: nn.Module
    offload: bool = False
    functorch: dict[str, Any] = field(default_factory=dict)
    backend: Any = None
    budget: int | None = None


@dataclass(frozen=True)
class Task:
    """What a method's process is given: the method, the config file and step, the
    compiler inside (`inner`: "inductor" or "eager", unfused, for a quick CPU run), the
    full_ac peak memplan's budgets are of, the host link in bytes/s, and where the fit
    writes its plan."""

    method: str
    config: str
    seq: int
    batch: int
    dtype: str
    steps: int
    inner: str
    full_ac_peak: int | None = None
    bandwidth: float | None = None
    fit_budget: str = ""
    out: str = ""


def compiled(model: nn.Module, inner: str) -> nn.Module:
    """torch.compile's default, or, with `inner` "eager", its partitioner without Inductor
    (aot_eager_decomp_partition: the same decisions, unfused)."""
    if inner == "inductor":
        return torch.compile(model)
    return torch.compile(model, backend="aot_eager_decomp_partition")


def checkpointed(model: nn.Module) -> nn.Module:
    """The model with transformers' gradient checkpointing of every layer (model is a
    memplan.tools.zoo.LossOf around the transformers model)."""
    model.model.gradient_checkpointing_enable(
        gradient_checkpointing_kwargs={"use_reentrant": False}
    )
    return model


def memplan_setup(
    model: nn.Module, task: Task, budget: int, offload: bool, optimizer: MixedPrecisionAdamW
) -> Setup:
    """torch.compile with memplan's backend at the step's `budget`, told the optimizer:
    memplan counts AdamW's moments, the fp32 masters and their gradients beside the
    compiled graphs (memplan/planner/outside.py)."""
    import memplan

    backend = memplan.backend(
        budget=budget,
        optimizer=optimizer.adamw,
        inner=task.inner,
        offload=offload,
        bandwidth=task.bandwidth if offload else None,
        progress=False,
    )
    return Setup(torch.compile(model, backend=backend), backend=backend, budget=budget)


def full_ac_peak(task: Task) -> int:
    if task.full_ac_peak is None:
        raise RuntimeError("full_ac has no measured peak to take a budget from")
    return task.full_ac_peak


METHODS: dict[str, Callable[[nn.Module, Task, MixedPrecisionAdamW], Setup]] = {
    "no_ac": lambda model, task, optimizer: Setup(compiled(model, task.inner)),
    "full_ac": lambda model, task, optimizer: Setup(compiled(checkpointed(model), task.inner)),
    "memplan_at_full_ac": lambda model, task, optimizer: memplan_setup(
        model, task, full_ac_peak(task), False, optimizer
    ),
    "memplan_offload": lambda model, task, optimizer: memplan_setup(
        model, task, int(OFFLOAD_SHARE * full_ac_peak(task)), True, optimizer
    ),
    "torch_compile_budget": lambda model, task, optimizer: Setup(
        compiled(model, task.inner), functorch={"activation_memory_budget": COMPILE_BUDGET}
    ),
    "torch_offload": lambda model, task, optimizer: Setup(
        compiled(checkpointed(model), task.inner), offload=True
    ),
}


def one_run(task: Task, record: dict[str, Any]) -> None:
    """Train with `task.method` and fill `record` as it goes (printed as a JSON line after
    its first step, so that a run cut off keeps what it measured)."""
    from memplan.tools.fake_model import causal_lm

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)  # every method trains the same weights on the same tokens
    with device:  # made on the device where transformers allows, else moved there
        example = causal_lm(
            task.config, batch=task.batch, seq=task.seq, dtype=task.dtype, fake=False
        )
    example = example.to(device)
    optimizer = MixedPrecisionAdamW(list(example.model.parameters()))
    record["parameters"] = sum(p.numel() for p in example.model.parameters())
    started = time.perf_counter()
    if task.method == "fit_prediction":
        setup = carried_out_fit(example.model, example.inputs, task, record)
    else:
        setup = METHODS[task.method](example.model, task, optimizer)
    record["budget_bytes"] = setup.budget
    losses: list[float] = record.setdefault("losses", [])

    def step() -> None:
        saved = torch.autograd.graph.save_on_cpu(pin_memory=True)
        with saved if setup.offload else contextlib.nullcontext():
            loss = setup.run(*example.inputs)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

    with torch._functorch.config.patch(setup.functorch):
        step()
        record["compile_s"] = time.perf_counter() - started
        report(record)
        held = [*example.model.parameters(), *example.inputs, *optimizer.tensors()]
        record["peak_bytes"] = steady_peak(step, held, device)
        seconds = median_step_seconds(step, device=device, repeats=task.steps, warmup=0)
    record["tokens_per_s"] = task.batch * task.seq / seconds
    if setup.backend is not None:
        plans = setup.backend.plans
        record["predicted_peak_bytes"] = setup.backend.predicted_step_peak
        record["outside_bytes"] = setup.backend.outside.total
        record["graphs"] = setup.backend.graphs
        record["statuses"] = sorted({p.status for p in plans})


def steady_peak(step: Callable[[], None], held: list[torch.Tensor], device: torch.device) -> int:
    """The peak of one step: max_memory_allocated after a reset on a GPU (what the step
    allocates and all that is held before it); on CPU the allocator's events above the
    tensors `held` before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device)
    return measure_peak(step, resident=held, device=device).peak_bytes


def carried_out_fit(
    model: nn.Module, inputs: tuple[torch.Tensor, ...], task: Task, record: dict[str, Any]
) -> Setup:
    """`memplan plan --hf-config` of the task's config on fake tensors for the device's
    roofline (its prediction and time into `record`), then its plan carried out on
    `model`: re-applied, or where its tensors' names are not the device trace's, planned
    again there for the same budget."""
    import memplan
    from memplan.cli.main import main as memplan_command
    from memplan.core.devices import TARGETS, target

    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    found = [key for key, (pattern, _) in TARGETS.items() if re.search(pattern, name)]
    device_name = (found or ["h100"])[0]
    path = Path(task.out) / "fit-plan.json"
    command = ["plan", "--hf-config", task.config, "--seq", str(task.seq)]
    command += ["--batch", str(task.batch), "--dtype", task.dtype, "--target", device_name]
    command += ["--budget", task.fit_budget, "-o", str(path)]
    if task.bandwidth:
        command += ["--bandwidth", str(task.bandwidth)]
    started = time.perf_counter()
    status = memplan_command(command)
    record["plan_s"] = time.perf_counter() - started
    if status:  # 1: no plan fits the budget; 2 or 3: an error (the log says which)
        raise RuntimeError(f"memplan plan exited {status} at the budget {task.fit_budget}")
    plan = memplan.Plan.load(path)
    record["predicted_peak_bytes"] = plan.predicted_peak + plan.outside
    record["unplanned_peak_bytes"] = plan.unplanned_peak + plan.outside
    report(record)
    options = {"measure": False, "device_spec": target(device_name), "progress": False}
    options |= {"offload": True, "bandwidth": task.bandwidth, "best_effort": True}
    try:
        planned = memplan.optimize(model, inputs, plan.budget, reuse=plan, **options)
        record["carried_out"] = "reused"
    except PlanFileError as error:
        planned = memplan.optimize(model, inputs, plan.budget, **options)
        record["carried_out"] = f"planned again on the device: {error}"
        record["replanned_peak_bytes"] = planned.plan.predicted_peak + plan.outside
    return Setup(planned, budget=plan.budget + plan.outside)


def host_link(device: torch.device) -> dict[str, float]:
    """Bytes/s of a copy between pinned host memory and the device, each way (the median
    of five copies of LINK_BYTES)."""
    host = torch.empty(LINK_BYTES, dtype=torch.uint8, pin_memory=True)
    on_device = torch.empty(LINK_BYTES, dtype=torch.uint8, device=device)
    copies = {
        "host_to_device": lambda: on_device.copy_(host, non_blocking=True),
        "device_to_host": lambda: host.copy_(on_device, non_blocking=True),
    }
    return {
        way: LINK_BYTES / median_step_seconds(copy, device=device, repeats=5, warmup=1)
        for way, copy in copies.items()
    }


def this_machine() -> dict[str, Any]:
    """benchmarks.models.machine with the device's memory, transformers' version, and on a
    GPU the host link and the host time of one transfer's calls that memplan charges."""
    import transformers

    from memplan.planner.transfer_cost import transfer_seconds

    found = machine()
    found["transformers"] = transformers.__version__
    found["cpu_cores"] = os.cpu_count()
    if found["device"] == "cuda":
        device = torch.device("cuda")
        found["memory_bytes"] = torch.cuda.get_device_properties(device).total_memory
        found["cuda"] = torch.version.cuda
        found["host_link"] = host_link(device)
        found["transfer_calls_us"] = transfer_seconds(device) * 1e6
    return found


def report(record: dict[str, Any]) -> None:
    print(json.dumps(record), flush=True)


def child(task: Task) -> dict[str, Any]:
    """Run `task` in this process: the machine's description, or one method's record,
    with `error` where it raised and what memplan warned of (a budget under its least,
    planned for the least) in `warnings`; other warnings go to stderr."""
    if task.method == "machine":
        found = this_machine()
        report(found)
        return found
    record: dict[str, Any] = {"method": task.method}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            one_run(task, record)
        except Exception as error:  # an out-of-memory error, say: the record says so
            traceback.print_exc()
            # All of it: Dynamo names a backend's error (an out-of-memory one) on later lines.
            record["error"] = f"{type(error).__name__}: {one_line(error)}"[:500]
    ours = [w for w in caught if issubclass(w.category, MemplanWarning)]
    for text in sorted({str(w.message) for w in caught if w not in ours}):
        print(text, file=sys.stderr)
    if ours:
        record["warnings"] = sorted({str(w.message) for w in ours})
    report(record)
    return record


# --- the campaign ------------------------------------------------------------------------


def in_process(task: Task, seconds: float, log: Path) -> dict[str, Any]:
    """`task` in a fresh process with caches of its own, stopped after `seconds`; its
    output goes to `log`, and its last record comes back (with `error` where it did not
    end well)."""
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as caches, log.open("w") as output:
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": f"{caches}/inductor",
            "MEMPLAN_CACHE_DIR": f"{caches}/memplan",
            "TRITON_CACHE_DIR": f"{caches}/triton",
            "HF_HUB_OFFLINE": "1",
        }
        command = [sys.executable, "-m", "benchmarks.llm_gpu", "--child", json.dumps(asdict(task))]
        # A session of its own: a stop ends the compile workers it started too.
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=output, text=True, env=env, cwd=ROOT,
            start_new_session=True,
        )  # fmt: skip
        try:
            printed, _ = process.communicate(timeout=seconds)
            stopped = None
        except subprocess.TimeoutExpired:
            printed, stopped = "", f"stopped after {seconds:.0f} s"
        finally:  # also where this process is stopped (main turns SIGTERM into SystemExit)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if stopped is not None:
            printed = process.communicate()[0]
        output.write(printed)
    records = [line for line in printed.splitlines() if line.startswith("{")]
    found = json.loads(records[-1]) if records else {"method": task.method}
    if stopped is not None:
        found["error"] = stopped
    elif process.returncode and "error" not in found:
        tail = log.read_text().strip().splitlines() or ["no output"]
        found["error"] = f"exit {process.returncode}: {tail[-1][:300]}"
    found["wall_s"] = time.perf_counter() - started
    return found


def campaign(args: argparse.Namespace, size: Size, out: Path) -> dict[str, Any]:
    """Every method of `args.methods` on `size`, one process each, saved to out/RESULT
    after each."""
    deadline = time.perf_counter() + args.time_limit
    config = write_config(size, out / "llama-config.json")
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    base = Task("machine", str(config), size.seq, size.batch, size.dtype, size.steps, args.inner)
    base = replace(base, fit_budget=size.fit_budget, out=str(out))

    def run(task: Task) -> dict[str, Any]:
        if args.same_process:
            torch.compiler.reset()
            return child(task)
        left = min(METHOD_SECONDS[task.method], deadline - time.perf_counter())
        if left <= 0:
            return {"method": task.method, "error": "not run: the campaign's time was up"}
        return in_process(task, left, logs / f"{task.method}.log")

    where = run(base)
    if "error" in where:
        raise SystemExit(f"the machine could not be described: {where['error']}")
    if not size.batch and "memory_bytes" not in where:
        raise SystemExit("a GPU's memory chooses the batch of this size: give --batch here")
    link = where.get("host_link")
    bandwidth = min(link.values()) if link else None
    batch = size.batch or batch_for(where["memory_bytes"], size)
    fit_budget = size.fit_budget or str(int(FIT_SHARE * where.get("memory_bytes", 0)))
    base = replace(base, batch=batch, bandwidth=bandwidth, fit_budget=fit_budget)
    saved: dict[str, Any] = {
        "machine": where,
        "size": {**asdict(size), "batch": batch, "fit_budget": fit_budget, "inner": args.inner},
        "runs": [],
    }
    path = out / RESULT
    write_json_atomically(path, saved)
    for method in args.methods:
        full_ac = next((r for r in saved["runs"] if r["method"] == "full_ac"), {})
        task = replace(base, method=method, full_ac_peak=full_ac.get("peak_bytes"))
        found = run(task)
        saved["runs"].append(found)
        saved["targets"] = targets(saved["runs"])
        write_json_atomically(path, saved)
        print(summary(found), flush=True)
    return saved


# --- targets and the page ------------------------------------------------------------------


def measured(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The runs that measured a step, by method."""
    return {r["method"]: r for r in runs if "tokens_per_s" in r and "error" not in r}


def targets(runs: list[dict[str, Any]]) -> dict[str, bool | None]:
    """Which of the issue's targets the runs meet (None: a run they need was not measured)."""
    ok = measured(runs)
    full, no_ac, fit = ok.get("full_ac"), ok.get("no_ac"), ok.get("fit_prediction")
    at, offload = ok.get("memplan_at_full_ac"), ok.get("memplan_offload")
    ours = [r for r in (at, offload) if r is not None]

    def speed(r: dict[str, Any]) -> float:
        assert full is not None
        return r["tokens_per_s"] / full["tokens_per_s"]

    def off_by(r: dict[str, Any]) -> float:
        return abs(r["predicted_peak_bytes"] / r["peak_bytes"] - 1)

    met: dict[str, bool | None] = dict.fromkeys(TARGETS)
    if full is not None and at is not None:
        within = at["peak_bytes"] <= at["budget_bytes"] + OVER_BUDGET
        met[TARGETS[0]] = speed(at) >= FASTER_AT_FULL_AC and within
    if full is not None and offload is not None:
        lower = offload["peak_bytes"] <= OFFLOAD_SHARE * full["peak_bytes"]
        met[TARGETS[1]] = lower and speed(offload) >= OFFLOAD_SPEED
    if ours:
        met[TARGETS[2]] = all(off_by(r) <= PREDICTED for r in ours)
    if fit is not None:
        met[TARGETS[3]] = off_by(fit) <= FIT_PREDICTED
    if ours and no_ac is not None:
        met[TARGETS[4]] = all(r["compile_s"] <= COMPILE_SLOWER * no_ac["compile_s"] for r in ours)
    if runs:
        met[TARGETS[5]] = not any("out of memory" in r.get("error", "").lower() for r in runs)
    return met


TARGETS = (
    f"memplan at full_ac's peak: >= {FASTER_AT_FULL_AC:.2f}x its tokens/s, peak within the "
    "budget + 0.1 GiB",
    f"memplan_offload: peak <= {OFFLOAD_SHARE}x full_ac's at >= {OFFLOAD_SPEED}x its tokens/s",
    f"memplan's predicted peaks within {PREDICTED:.0%} of max_memory_allocated",
    f"fit_prediction's predicted peak within {FIT_PREDICTED:.0%} of its plan's, measured",
    f"memplan's compile time <= {COMPILE_SLOWER}x torch.compile's (no_ac's)",
    "no run out of memory",
)


def verdict(met: bool | None) -> str:
    return "not measured" if met is None else ("met" if met else "**not met**")


def loss_difference(run: dict[str, Any], reference: dict[str, Any]) -> float | None:
    """The largest relative difference of `run`'s losses from `reference`'s, step by step."""
    pairs = list(zip(run.get("losses", []), reference.get("losses", []), strict=False))
    return max((abs(a / b - 1) for a, b in pairs), default=None)


def summary(r: dict[str, Any]) -> str:
    took = f" ({r['wall_s']:.0f} s in all)" if "wall_s" in r else ""
    if "error" in r:
        return f"{r['method']}: {r['error']}{took}"
    return (
        f"{r['method']}: peak {format_bytes(r['peak_bytes'])}, {r['tokens_per_s']:.0f} "
        f"tokens/s, first step {r['compile_s']:.1f} s{took}"
    )


def markdown(saved: dict[str, Any]) -> str:
    where, size = saved["machine"], saved["size"]
    unfused = ", compiled unfused (no Inductor)" if size["inner"] == "eager" else ""
    link = where.get("host_link")
    host = (
        f"; host link {link['host_to_device'] / 1e9:.1f} GB/s to the device and "
        f"{link['device_to_host'] / 1e9:.1f} GB/s back"
        if link
        else ""
    )
    lines = [
        f"Measured on a {where['device_name']} ({where['device']}), torch {where['torch']}, "
        f"transformers {where['transformers']}, {where['date']}{host}, by "
        "`benchmarks/llm_gpu.sh`: the Llama-3.2-1B-shaped decoder with "
        f"{size['layers']} layers, {size['batch']} x {size['seq']} tokens in {size['dtype']}, "
        "AdamW (on fp32 master weights of bf16 ones), each method in a process of its own "
        f"with empty caches{unfused}. Peak: max_memory_allocated of a steady step; "
        f"tokens/s: the median of {size['steps']} steps; compile: the first step.",
        "",
        f"![peak against tokens per second]({PLOT})",
        "",
        "| target | |",
        "|---|---|",
        *(f"| {name} | {verdict(met)} |" for name, met in targets(saved["runs"]).items()),
        "",
        "| method | peak | budget | predicted | tokens/s | compile | loss vs no_ac |",
        "|---|---|---|---|---|---|---|",
    ]
    no_ac = measured(saved["runs"]).get("no_ac", {})
    for r in saved["runs"]:
        if "error" in r:
            lines.append(f"| {r['method']} | {r['error']} | | | | | |")
            continue
        predicted = r.get("predicted_peak_bytes")
        off = f" ({100 * (predicted / r['peak_bytes'] - 1):+.1f}%)" if predicted else ""
        budget = r.get("budget_bytes")
        difference = loss_difference(r, no_ac)
        lines.append(
            f"| {r['method']} | {format_bytes(r['peak_bytes'])} | "
            f"{format_bytes(budget) if budget else ''} | "
            f"{format_bytes(predicted) + off if predicted else ''} | "
            f"{r['tokens_per_s']:,.0f} | {r['compile_s']:.1f} s | "
            f"{'' if difference is None else f'{difference:.1e}'} |"
        )
    fit = measured(saved["runs"]).get("fit_prediction")
    if fit is not None:
        lines += ["", f"fit_prediction's plan was {fit['carried_out']}."]
    return "\n".join(lines) + "\n"


def plot(saved: dict[str, Any], path: Path) -> None:
    figure, ax = plt.subplots(figsize=(6.5, 4.2))
    for method, r in measured(saved["runs"]).items():
        point = (r["peak_bytes"] / 2**30, r["tokens_per_s"])
        ax.scatter(*point, marker="o" if "predicted_peak_bytes" in r else "x")
        ax.annotate(method, point, fontsize=8, xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("peak of a steady step (GiB)")
    ax.set_ylabel("tokens / s")
    ax.set_title(f"{saved['machine']['device_name']}, {saved['size']['layers']} layers")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_page(saved: dict[str, Any], docs: Path) -> None:
    """The plot and the section of docs/results.md, under `docs`."""
    plot(saved, docs / PLOT)
    write_section(docs / "results.md", markdown(saved), *MARKERS)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", choices=SIZES, default="gpu")
    parser.add_argument("--layers", type=int, help="layers of the decoder (default: the size's)")
    parser.add_argument("--batch", type=int, help="sequences per step (default: the size's)")
    parser.add_argument("--seq", type=int, help="tokens per sequence (default: the size's)")
    parser.add_argument("--methods", nargs="+", choices=ORDER, default=list(ORDER))
    parser.add_argument("--inner", choices=("inductor", "eager"), default="inductor",
                        help="compile with Inductor, or unfused (a quick CPU run)")  # fmt: skip
    parser.add_argument("--out", type=Path, help=f"where {RESULT} and the logs go (default: "
                        "benchmarks/results; the tiny size needs one)")  # fmt: skip
    parser.add_argument("--docs", type=Path, help="where results.md's section and the plot go "
                        "(default: docs, or --out for the tiny size)")  # fmt: skip
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT, metavar="S")
    parser.add_argument("--same-process", action="store_true",
                        help="run the methods one after another in this process (no time "
                        "limits, no caches of their own: a quick test)")  # fmt: skip
    parser.add_argument("--report-only", type=Path, metavar="JSON",
                        help="rewrite the page from a saved campaign")  # fmt: skip
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(Task(**json.loads(args.child)))
        return
    if args.report_only:
        write_page(json.loads(args.report_only.read_text()), args.docs or DOCS)
        return
    tiny = args.sizes == "tiny"
    if tiny and args.out is None:
        parser.error("the tiny size's figures are no results: give it --out")
    if not args.same_process:  # `timeout` stopping this process stops the method's too
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    size = SIZES[args.sizes]
    overrides = {"layers": args.layers, "batch": args.batch, "seq": args.seq}
    size = replace(size, **{k: v for k, v in overrides.items() if v is not None})
    out = args.out or RESULTS
    saved = campaign(args, size, out)
    for name, met in saved["targets"].items():
        print(f"{verdict(met)}: {name}")
    write_page(saved, args.docs or (out if tiny else DOCS))


if __name__ == "__main__":
    main()
