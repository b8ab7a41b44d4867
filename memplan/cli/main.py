"""The `memplan` command: plan a saved torch.export program, or a model built on fake
tensors for a GPU one does not have (`plan --hf-config` / `--builder`, cli_fit.py); show a
saved plan, solve a literature graph, find the largest batch under a memory cap, list
solvers.

Only `plan` and `maxbatch` load torch, when they run: `show`, `solve` and `solvers` work
without it.

Every error a user can cause ends as one line `memplan: error: ...` and exit status 2,
before any output file is written or with every output file left as it was; a check that
fails (`plan --verify`, or a model on fake tensors that fits no plan) exits with status 1
and writes no plan; a bug in memplan ends as one line `memplan: internal error: ...` and
exit status 3 (--verbose shows the traceback of either).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from rich.console import Console

from memplan import solvers
from memplan.cli.args import (
    EXIT_CHECK_FAILED,
    EXIT_ERROR,
    check_outputs,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    write_all,
    write_plan,
)
from memplan.cli.fit import add_fit_options, check_fit_options, plan_config
from memplan.core import remat
from memplan.core.budget import Budget
from memplan.core.errors import BudgetError, MemplanError, one_line
from memplan.core.files import write_json_atomically
from memplan.core.node_link import load_node_link
from memplan.core.schedule_file import solved_schedule
from memplan.core.units import format_bytes
from memplan.planner.layout import METHODS as LAYOUTS
from memplan.planner.options import CONVOLUTION_COPIES, FRAGMENTATION, PlanOptions
from memplan.planner.plan_file import Plan
from memplan.planner.solve import provenance, solve_within_budget
from memplan.solvers.bounds import peak_lower_bound
from memplan.tools import batch_search
from memplan.tools.report import (
    decision_table,
    maxbatch_table,
    placement_plot,
    plot_timeline,
    require_placements,
    summary_table,
    verification_table,
)

DEFAULTS = PlanOptions()
EXIT_INTERNAL = 3


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
        print(f"memplan: error: {one_line(error)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        if args.verbose:
            raise
        print("memplan: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # a bug in memplan: still one line, its traceback on request
        if args.verbose:
            raise
        print(
            f"memplan: internal error: {type(error).__name__}: {one_line(error)} "
            "(--verbose shows the traceback)",
            file=sys.stderr,
        )
        return EXIT_INTERNAL


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
        help="plan a torch.export program (.pt2), or a transformers config for a GPU, under a "
        "memory budget",
        description="Plan one training step of a torch.export program saved with "
        "torch.export.save(program, 'model.pt2') from example inputs (export with args); "
        "or, with --hf-config, the whole training step (optimizer state included) of a "
        "transformers causal LM built on fake tensors, for a target GPU, without allocating "
        "or running anything.",
    )
    plan.add_argument(
        "model", type=Path, nargs="?", help="a .pt2 file written by torch.export.save"
    )
    plan.add_argument(
        "--budget",
        required=True,
        help="peak device memory: '2GiB', '512MB', 2e9, or a share of the unplanned peak: "
        "'60%%' or 0.6",
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
        "--fragmentation",
        choices=FRAGMENTATION,
        default=DEFAULTS.fragmentation,
        help="what the budget bounds: 'live', the bytes live at once; 'arena', the arena "
        "the plan's allocations are laid out in, fragmentation included (default: "
        f"{DEFAULTS.fragmentation})",
    )
    plan.add_argument(
        "--convolution-copies",
        choices=CONVOLUTION_COPIES,
        default=DEFAULTS.convolution_copies,
        help="where a convolution's input of another layout is made contiguous: 'kernel', "
        "inside the kernel; 'graph', as a node the plan can free; 'choose', plan both and "
        f"keep the faster plan within the budget (default: {DEFAULTS.convolution_copies})",
    )
    plan.add_argument(
        "--layout",
        choices=LAYOUTS,
        default=DEFAULTS.layout,
        help="how allocations are laid out in the arena: 'size', best fit, largest first; "
        "'start', first fit in allocation order; 'exact', CP-SAT; 'best', the better "
        "heuristic, then, where the budget bounds the arena, CP-SAT on small graphs "
        f"(default: {DEFAULTS.layout})",
    )
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
        type=positive_float,
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
    add_fit_options(plan)
    plan.set_defaults(command=_plan)

    show = commands.add_parser(
        "show", parents=[common], help="print a saved plan and optionally plot its timeline"
    )
    show.add_argument("plan", type=Path, help="a plan.json written by `memplan plan`")
    show.add_argument("--png", type=Path, help="write the memory timeline plot here")
    show.add_argument(
        "--placement-png",
        type=Path,
        metavar="PATH",
        help="write a plot of where each allocation lies in the arena over the steps here",
    )
    show.add_argument(
        "--top",
        type=non_negative_int,
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
        type=positive_float,
        metavar="BYTES_PER_S",
        help="host link bandwidth: lets solvers that page move values to host memory",
    )
    solve.add_argument(
        "-o", "--output", type=Path, required=True, help="where to write the schedule (JSON)"
    )
    solve.set_defaults(command=_solve)

    largest = commands.add_parser(
        "maxbatch",
        parents=[common],
        help="find the largest batch that trains under a memory cap",
        description="Search the largest batch size that trains one step under a memory cap "
        "(enforced: torch.cuda's per-process memory fraction on a GPU; on CPU the "
        "allocator's record of the step, a step over the cap counting as out of memory) "
        "for eager, PyTorch's min-cut partitioner at its best activation budget and "
        "memplan, each within a step-time overhead limit per sample against eager's "
        "largest batch.",
    )
    largest.add_argument(
        "model",
        help="a model of memplan.tools.zoo (mlp, gpt2, resnet50, ...) or MODULE:FUNCTION, a "
        "function that takes batch=N and returns a memplan.tools.zoo.Example or (model, inputs)",
    )
    largest.add_argument("--cap", required=True, help="device memory cap: '2GiB', '512MB', 2e9")
    largest.add_argument(
        "--overhead",
        type=non_negative_float,
        default=batch_search.DEFAULT_OVERHEAD,
        help="step-time overhead limit per sample, as a fraction (default: "
        f"{batch_search.DEFAULT_OVERHEAD:g})",
    )
    largest.add_argument(
        "--methods", nargs="+", choices=batch_search.METHODS, default=list(batch_search.METHODS)
    )
    largest.add_argument(
        "--solver", default=DEFAULTS.solver, help=f"memplan's solver (default: {DEFAULTS.solver})"
    )
    _add_search_options(largest)
    largest.add_argument("--start", type=positive_int, default=1, help="first batch size")
    largest.add_argument(
        "--max-batch", type=positive_int, default=1 << 16, help="largest batch size tried"
    )
    largest.add_argument("-o", "--output", type=Path, help="also write the results here (JSON)")
    largest.set_defaults(command=_maxbatch)

    listing = commands.add_parser("solvers", parents=[common], help="list the solver names")
    listing.set_defaults(command=_solvers)
    return parser


def _add_search_options(command: argparse.ArgumentParser) -> None:
    """--time-limit and --seed, which every solving command takes."""
    command.add_argument(
        "--time-limit",
        type=positive_float,
        default=DEFAULTS.time_limit,
        metavar="S",
        help=f"solver time limit in seconds (default: {DEFAULTS.time_limit:g})",
    )
    command.add_argument("--seed", type=int, default=DEFAULTS.seed, help="solver seed")


def _plan(args: argparse.Namespace, console: Console) -> int:
    # Check everything cheap before loading torch and tracing the model.
    budget = Budget.parse(args.budget)
    solvers.check_known(args.solver)
    given = [x for x in (args.model, args.hf_config, args.builder) if x is not None]
    if len(given) != 1:
        raise MemplanError("give one of a MODEL file, --hf-config or --builder")
    if args.model is None:
        return plan_config(args, budget, console)
    check_fit_options(args)
    check_outputs([args.model], [args.output, args.png])
    from memplan import api
    from memplan.planner.model_file import load_model
    from memplan.tools.verify import verify

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
        fragmentation=args.fragmentation,
        layout=args.layout,
        convolution_copies=args.convolution_copies,
    )
    plan = dataclasses.replace(plan, name=args.model.stem)
    console.print(summary_table(plan))
    measured_peak = None
    status = 0
    if args.verify:
        check = verify(model, inputs, plan)
        measured_peak = check.measured_peak
        console.print(verification_table(check))
        for problem in check.problems():
            print(f"memplan: check failed: {problem}", file=sys.stderr)
        status = 0 if check.ok else EXIT_CHECK_FAILED
    write_plan(plan, args.output, args.png, console, measured_peak)
    return status


def _show(args: argparse.Namespace, console: Console) -> int:
    check_outputs([args.plan], [args.png, args.placement_png])
    plan = Plan.load(args.plan)
    if args.placement_png is not None:
        require_placements(plan)  # an older plan file fails before anything is printed
    console.print(summary_table(plan))
    console.print(decision_table(plan, top=args.top or None))
    # Both plots or neither: an error in one leaves the other's file as it was.
    outputs: list[tuple[Path, Callable[[Path], object]]] = []
    if args.png is not None:
        outputs.append((args.png, lambda at: plot_timeline(plan, at)))
    if args.placement_png is not None:
        outputs.append((args.placement_png, lambda at: placement_plot(plan, at)))
    write_all(outputs, console)
    return 0


def _solve(args: argparse.Namespace, console: Console) -> int:
    solvers.check_known(args.solver)  # an unknown name fails before the graph is read
    check_outputs([args.graph], [args.output])
    graph = load_node_link(args.graph)
    budget = remat.resolve_budget(graph, args.budget)
    options = solvers.SolverOptions(
        seed=args.seed, time_limit=args.time_limit, bandwidth=args.bandwidth, problem="general"
    )
    solved = solve_within_budget(graph, budget, args.solver, options)
    result = solved.result
    report = solved_schedule(graph, budget, result, bandwidth=args.bandwidth)
    bound = peak_lower_bound(graph)
    report["peak_lower_bound"] = bound
    note = provenance(solved, args.solver, options)
    if note is not None:
        report["note"] = note  # the file says which schedule it holds, as the output does
    write_json_atomically(args.output, report)
    reference = remat.reference(graph)
    if reference.duration > 0:
        increase = (report["duration"] - reference.duration) / reference.duration
        duration = f"duration {increase:+.2%} vs the reference order"
    else:  # every node takes no time
        duration = f"duration {report['duration']:g}, as the reference order"
    console.print(
        f"{graph.name}: {report['status']} with {result.solver}, peak "
        f"{format_bytes(report['peak'])} of budget {format_bytes(budget)}, {duration}, "
        f"solved in {result.solve_seconds:.2f} s"
    )
    above = report["peak"] / bound - 1 if bound else 0.0
    console.print(f"no schedule peaks below {format_bytes(bound)}: this one is {above:.1%} above")
    if note is not None:
        console.print(note)
    console.print(f"wrote {args.output}", soft_wrap=True)
    return 0


def _maxbatch(args: argparse.Namespace, console: Console) -> int:
    cap = Budget.parse(args.cap)
    if cap.bytes is None:
        raise BudgetError(f"the cap must be an amount of memory, not a share: {args.cap!r}")
    solvers.check_known(args.solver)
    check_outputs([], [args.output])
    if args.start > args.max_batch:
        raise MemplanError(f"--start {args.start} is above --max-batch {args.max_batch}")
    from memplan.tools import maxbatch

    build = maxbatch.builder(args.model)

    def report(method: str, probe: batch_search.Probe) -> None:
        verdict = "fits" if probe.fits else f"does not fit: {probe.reason}"
        console.print(f"  {method} batch {probe.batch}: {verdict}")

    results = maxbatch.max_batch(
        build,
        cap.bytes,
        args.methods,
        overhead=args.overhead,
        solver=args.solver,
        start=args.start,
        limit=args.max_batch,
        time_limit=args.time_limit,
        on_probe=report,
    )
    console.print(maxbatch_table(results))
    if args.output is not None:
        found = {"model": args.model, "results": [r.to_json() for r in results]}
        write_json_atomically(args.output, found)
        console.print(f"wrote {args.output}", soft_wrap=True)
    return 0


def _solvers(args: argparse.Namespace, console: Console) -> int:
    for name in solvers.available():
        console.print(f"{name:10} {' and '.join(solvers.problems(name))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
