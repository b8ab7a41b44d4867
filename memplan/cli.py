"""The `memplan` command: plan a saved torch.export program, show a saved plan, list solvers.

Every error a user can cause ends as one line `memplan: error: ...` and exit status 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from torch import nn

from memplan import api, remat, solvers
from memplan.errors import MemplanError, ModelFileError
from memplan.files import write_json_atomically
from memplan.graph import Budget, format_bytes, load_node_link
from memplan.planner import capture
from memplan.planner.plan import Plan, PlanOptions
from memplan.report import decision_table, plot_timeline, summary_table, verification_table
from memplan.solvers import general
from memplan.verify import verify

# torch.save files; loading one unpickles, which can run any code the file's author chose.
PICKLE_SUFFIXES = frozenset({".pt", ".pth", ".pkl", ".pickle"})
DEFAULTS = PlanOptions()
EXIT_ERROR = 2
EXIT_CHECK_FAILED = 1


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line `argv` (default: sys.argv[1:]); returns the exit status."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # argparse exits on --help (0) and on usage errors (2)
        return stop.code if isinstance(stop.code, int) else EXIT_ERROR
    command: Callable[[argparse.Namespace, Console], int] = args.command
    try:
        return command(args, Console())
    except (MemplanError, OSError) as error:
        if args.verbose:
            raise
        print(f"memplan: error: {_one_line(error)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        if args.verbose:
            raise
        print("memplan: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `memplan` and its subcommands."""
    parser = argparse.ArgumentParser(
        prog="memplan",
        description="Plan training memory in PyTorch: keep, recompute or offload each "
        "activation so that one training step fits a memory budget.",
    )
    parser.add_argument("--verbose", action="store_true", help="show tracebacks of errors")
    # Also accepted after the subcommand; SUPPRESS keeps the subparser from resetting it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true", default=argparse.SUPPRESS)
    commands = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)

    plan = commands.add_parser(
        "plan",
        parents=[common],
        help="plan a torch.export program (.pt2) under a memory budget",
        description="Plan one training step of a torch.export program saved with "
        "torch.export.save(program, 'model.pt2') from example inputs (export with args).",
    )
    plan.add_argument("model", type=Path, help="a .pt2 file written by torch.export.save")
    plan.add_argument(
        "--budget", required=True, help="peak device memory: '2GiB', '512MB', 2e9 or '60%%'"
    )
    plan.add_argument(
        "-o", "--output", type=Path, required=True, help="where to write the plan (JSON)"
    )
    plan.add_argument("--png", type=Path, help="also write the memory timeline plot here")
    plan.add_argument(
        "--solver",
        default=DEFAULTS.solver,
        help=f"solver name, see `memplan solvers` (default: {DEFAULTS.solver})",
    )
    _add_search_options(plan)
    plan.add_argument(
        "--no-measure",
        dest="measure",
        action="store_false",
        help="estimate node times from a roofline model instead of running each node",
    )
    plan.add_argument(
        "--offload",
        action=argparse.BooleanOptionalAction,
        default=DEFAULTS.offload,
        help="allow offloading to host memory (default: only where the device is not the host)",
    )
    plan.add_argument(
        "--bandwidth",
        type=_positive_float,
        default=DEFAULTS.bandwidth,
        metavar="BYTES_PER_S",
        help="host link bandwidth assumed for offloading",
    )
    plan.add_argument(
        "--verify",
        action="store_true",
        help="then run one planned and one eager training step: check that the gradients "
        "match and measure the peak (exit status 1 if the check fails)",
    )
    plan.add_argument(
        "--allow-pickle",
        action="store_true",
        help="load a .pt/.pth file saved with torch.save({'model': module, 'inputs': tuple}); "
        "unpickling runs arbitrary code, so only for files you trust",
    )
    plan.set_defaults(command=_plan)

    show = commands.add_parser(
        "show", parents=[common], help="print a saved plan and optionally plot its timeline"
    )
    show.add_argument("plan", type=Path, help="a plan.json written by `memplan plan`")
    show.add_argument("--png", type=Path, help="write the memory timeline plot here")
    show.add_argument(
        "--top",
        type=_non_negative_int,
        default=20,
        metavar="N",
        help="show the N largest saved tensors (default: 20; 0: all)",
    )
    show.set_defaults(command=_show)

    solve = commands.add_parser(
        "solve",
        parents=[common],
        help="solve a benchmark graph of the literature (node-link JSON) under a budget",
        description="Solve the general rematerialization problem on a networkx node-link "
        "graph (a node may be recomputed at any point) and write the schedule as JSON, "
        "scored by the Checkmate/Moccasin rules.",
    )
    solve.add_argument("graph", type=Path, help="a node-link JSON file")
    solve.add_argument(
        "--budget",
        required=True,
        help="bytes ('2e9', '2GiB') or a share of the reference-order peak ('0.8', '80%%')",
    )
    solve.add_argument("--solver", default="keep_all", help="solver name (see `memplan solvers`)")
    _add_search_options(solve)
    solve.add_argument(
        "--bandwidth",
        type=_positive_float,
        metavar="BYTES_PER_S",
        help="host link bandwidth: lets solvers that page move values to host memory",
    )
    solve.add_argument(
        "-o", "--output", type=Path, required=True, help="where to write the schedule (JSON)"
    )
    solve.set_defaults(command=_solve)

    listing = commands.add_parser("solvers", parents=[common], help="list the solver names")
    listing.set_defaults(command=_solvers)
    return parser


def _add_search_options(command: argparse.ArgumentParser) -> None:
    """--time-limit and --seed, which every solving command takes."""
    command.add_argument(
        "--time-limit",
        type=_positive_float,
        default=DEFAULTS.time_limit,
        metavar="S",
        help=f"solver time limit in seconds (default: {DEFAULTS.time_limit:g})",
    )
    command.add_argument("--seed", type=int, default=DEFAULTS.seed, help="solver seed")


def _plan(args: argparse.Namespace, console: Console) -> int:
    # Check everything cheap before loading and tracing the model.
    budget = Budget.parse(args.budget)
    solvers.get_solver(args.solver)
    model, inputs = load_model(args.model, allow_pickle=args.allow_pickle)
    plan = api.plan(
        model,
        inputs,
        budget,
        args.solver,
        time_limit=args.time_limit,
        seed=args.seed,
        measure=args.measure,
        offload=args.offload,
        bandwidth=args.bandwidth,
    )
    plan = dataclasses.replace(plan, name=args.model.stem)
    plan.save(args.output)
    console.print(summary_table(plan))
    console.print(f"wrote {args.output}")
    measured_peak = None
    status = 0
    if args.verify:
        check = verify(model, inputs, plan)
        measured_peak = check.measured_peak
        console.print(verification_table(check))
        for problem in check.problems():
            print(f"memplan: check failed: {problem}", file=sys.stderr)
        status = 0 if check.ok else EXIT_CHECK_FAILED
    if args.png is not None:
        plot_timeline(plan, args.png, measured_peak=measured_peak)
        console.print(f"wrote {args.png}")
    return status


def _show(args: argparse.Namespace, console: Console) -> int:
    plan = Plan.load(args.plan)
    console.print(summary_table(plan))
    console.print(decision_table(plan, top=args.top or None))
    if args.png is not None:
        plot_timeline(plan, args.png)
        console.print(f"wrote {args.png}")
    return 0


def _solve(args: argparse.Namespace, console: Console) -> int:
    solvers.get_solver(args.solver)  # an unknown name fails before the graph is read
    graph = load_node_link(args.graph)
    budget = remat.resolve_budget(graph, args.budget)
    options = solvers.SolverOptions(
        seed=args.seed, time_limit=args.time_limit, bandwidth=args.bandwidth
    )
    result = general.solve(graph, budget, args.solver, options)
    report = remat.solved_schedule(graph, budget, result, bandwidth=args.bandwidth)
    write_json_atomically(args.output, report)
    reference = remat.reference(graph)
    increase = (report["duration"] - reference.duration) / reference.duration
    console.print(
        f"{graph.name}: {report['status']} with {result.solver}, peak "
        f"{format_bytes(report['peak'])} of budget {format_bytes(budget)}, duration "
        f"{increase:+.2%} vs the reference order, solved in {result.solve_seconds:.2f} s"
    )
    if result.solver != args.solver:
        console.print(result.message)
    console.print(f"wrote {args.output}")
    return 0


def _solvers(args: argparse.Namespace, console: Console) -> int:
    for name in solvers.available():
        console.print(f"{name:10} {' and '.join(solvers.REGISTRY[name][1])}")
    return 0


def load_model(path: Path, *, allow_pickle: bool = False) -> tuple[nn.Module, tuple[Any, ...]]:
    """The trainable module in a .pt2 program and its example inputs, or, with
    `allow_pickle`, those of a pickled {"model": module, "inputs": tuple} dict."""
    if path.suffix.lower() not in PICKLE_SUFFIXES:
        return capture.exported_module(capture.load_exported(path))
    if not allow_pickle:
        raise ModelFileError(
            f"{path}: loading a pickled model runs arbitrary code from the file; "
            "pass --allow-pickle if you trust it, or save a torch.export program (.pt2)"
        )
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file")
    try:
        data = torch.load(path, weights_only=False)
    except Exception as error:  # unpickling raises anything the file's classes raise
        raise ModelFileError(f"{path}: cannot unpickle: {_one_line(error)}") from error
    model = data.get("model") if isinstance(data, dict) else None
    inputs = data.get("inputs") if isinstance(data, dict) else None
    if not isinstance(model, nn.Module) or not isinstance(inputs, (tuple, list)):
        raise ModelFileError(
            f"{path}: expected a dict {{'model': nn.Module, 'inputs': tuple}}, "
            f"got {type(data).__name__}"
            + (f" with keys {sorted(map(str, data))}" if isinstance(data, dict) else "")
        )
    model.train()
    return model, tuple(inputs)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text!r}")
    return value


if __name__ == "__main__":
    sys.exit(main())
