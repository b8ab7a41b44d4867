"""`memplan plan --hf-config`: will a transformers model's training step fit a GPU one
may not have? Its options and its command; torch loads only when the command runs."""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from memplan.cli.args import EXIT_CHECK_FAILED, check_outputs, positive_int, write_plan
from memplan.core.budget import Budget
from memplan.core.devices import TARGETS, load_spec, target
from memplan.core.errors import MemplanError, MemplanWarning
from memplan.core.training_state import DTYPE_NAMES, OPTIMIZER_STATE
from memplan.core.units import format_bytes
from memplan.planner.options import PlanOptions
from memplan.tools.report import fit_table, fit_verdict

if TYPE_CHECKING:
    from memplan.tools.zoo import Example


def add_fit_options(plan: argparse.ArgumentParser) -> None:
    """The options of planning a config on fake tensors for a target device."""
    fit = plan.add_argument_group("will it fit? (a model built on fake tensors)")
    fit.add_argument(
        "--hf-config",
        metavar="PATH_OR_ID",
        help="a transformers config.json, its folder, or a model id cached locally (never "
        "downloaded): its causal LM, planned instead of MODEL",
    )
    fit.add_argument(
        "--builder",
        metavar="MODULE:FUNCTION",
        help="or a function taking batch=N that returns a memplan.tools.zoo.Example or "
        "(model, inputs) (or a zoo model's name), run on fake tensors",
    )
    fit.add_argument("--batch", type=positive_int, help="sequences per step (default: 1)")
    fit.add_argument("--seq", type=positive_int, help="tokens per sequence (required)")
    fit.add_argument(
        "--dtype",
        choices=DTYPE_NAMES,
        help="weights and activations; bf16 and fp16 add fp32 master weights and grads "
        "(default: fp32)",
    )
    fit.add_argument(
        "--optimizer",
        choices=OPTIMIZER_STATE,
        help="whose state the step holds: adamw (two fp32 moments per parameter), sgd "
        "(momentum), none (default: adamw)",
    )
    fit.add_argument(
        "--target", help=f"the GPU planned for: {', '.join(TARGETS)} (or --device-spec)"
    )
    fit.add_argument(
        "--device-spec", type=Path, metavar="FILE", help="a JSON device spec for another GPU"
    )
    fit.add_argument(
        "--ranks",
        type=positive_int,
        help="FSDP2 ranks the weights, gradients and optimizer state are sharded over; the "
        "peak is per rank (default: 1, unsharded)",
    )
    fit.add_argument(
        "--max-batch",
        action="store_true",
        help="also find the largest batch whose step fits the budget (bytes), by planning "
        "batches on fake tensors",
    )


# The options only planning on fake tensors takes; a MODEL file is planned without them.
FIT_ONLY = ("batch", "seq", "dtype", "optimizer", "target", "device_spec", "ranks", "max_batch")


def check_fit_options(args: argparse.Namespace) -> None:
    """MemplanError where an option of planning on fake tensors is given with a MODEL."""
    given = [name for name in FIT_ONLY if getattr(args, name) not in (None, False)]
    if given:
        flags = ", ".join(f"--{name.replace('_', '-')}" for name in given)
        raise MemplanError(f"{flags}: apply only with --hf-config or --builder, not a MODEL file")


def plan_config(args: argparse.Namespace, budget: Budget, console: Console) -> int:
    """`memplan plan --hf-config` (or --builder): the step's peak and its parts, the plan
    for the budget and optionally the largest batch; exit status 1 where nothing fits."""
    given = "--hf-config" if args.hf_config is not None else "--builder"
    if args.hf_config is not None and args.seq is None:
        raise MemplanError("--hf-config needs --seq, the tokens per sequence")
    if args.builder is not None and (args.seq is not None or args.dtype is not None):
        raise MemplanError("--seq and --dtype apply only with --hf-config; a builder sets its own")
    if (args.target is None) == (args.device_spec is None):
        raise MemplanError(f"{given} needs --target NAME or --device-spec FILE (one of them)")
    if args.verify or args.allow_pickle:
        raise MemplanError(f"--verify and --allow-pickle need a MODEL file, not {given}")
    if args.max_batch and budget.bytes is None:
        raise MemplanError("--max-batch needs a budget in bytes ('70GiB'), not a share")
    spec = target(args.target) if args.target else load_spec(args.device_spec)
    inputs = [p for p in (args.device_spec, args.hf_config and Path(args.hf_config)) if p]
    check_outputs([p for p in inputs if p.is_file()], [args.output, args.png])
    from memplan.tools.fake_model import causal_lm, from_builder
    from memplan.tools.fit import fit, largest_batch, ranks_needed

    options = PlanOptions(
        solver=args.solver,
        time_limit=args.time_limit,
        seed=args.seed,
        measure=False,
        device_spec=spec,
        # A GPU's host link is the spec's: offloading is planned unless --no-offload.
        offload=True if args.offload is None else args.offload,
        bandwidth=args.bandwidth or spec.host_to_device,
        fragmentation=args.fragmentation,
        layout=args.layout,
        convolution_copies=args.convolution_copies,
    )

    def from_config(batch: int) -> Example:
        return causal_lm(args.hf_config, batch=batch, seq=args.seq, dtype=args.dtype or "fp32")

    build = from_config if args.hf_config is not None else from_builder(args.builder)

    optimizer, ranks = args.optimizer or "adamw", args.ranks or 1
    with warnings.catch_warnings(), console.status(f"tracing and planning for {spec.name}"):
        warnings.simplefilter("ignore", MemplanWarning)  # every time is a roofline estimate
        found = fit(build(args.batch or 1), budget, options, optimizer=optimizer, ranks=ranks)
    console.print(fit_table(found))
    console.print(fit_verdict(found))
    if not found.fits and ranks == 1:
        needed = ranks_needed(found)
        if needed is not None and needed > 1:
            console.print(
                f"weights, gradients and optimizer state alone fit from --ranks {needed} on"
            )
    if args.max_batch:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MemplanWarning)
            largest = largest_batch(
                build,
                budget,
                options,
                optimizer=optimizer,
                ranks=ranks,
                on_probe=lambda b, f: console.print(
                    f"  batch {b}: {'fits' if f.fits else 'does not fit'} ({f.seconds:.1f} s)"
                ),
            )
        console.print(f"largest batch that fits {format_bytes(found.budget)}: {largest}")
    if found.plan is None:
        return EXIT_CHECK_FAILED
    name = args.builder if args.hf_config is None else _config_name(args.hf_config)
    write_plan(dataclasses.replace(found.plan, name=name), args.output, args.png, console)
    return 0


def _config_name(config: str) -> str:
    """A plan's name for a config: a config.json's folder, a file's name without .json,
    or the model id as given."""
    path = Path(config)
    if path.name == "config.json":
        return path.parent.name or "config"
    return path.name.removesuffix(".json") if path.exists() else config
