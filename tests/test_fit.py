"""Will it fit? (memplan/core/training_state.py, memplan/tools/fit.py and `memplan plan
--hf-config`): a model's whole training step, optimizer state included, planned on fake
tensors for a target device, its peak broken into parts, and budgets no plan can meet
proved so without a search."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest

import memplan
from memplan.cli.main import main
from memplan.core.budget import Budget
from memplan.core.devices import target
from memplan.core.errors import MemplanError, MemplanWarning
from memplan.core.graph import Graph, Node, NodeKind
from memplan.core.simulate import simulate
from memplan.core.training_state import GATHERED_UNITS, TrainingState, breakdown, floor, per_rank
from memplan.planner.options import PlanOptions
from memplan.solvers import SolverOptions, get_solver
from memplan.tools.fake_model import causal_lm
from memplan.tools.fit import fit, largest_batch, ranks_needed, training_state
from memplan.tools.verify import verify

GPT2 = {
    "model_type": "gpt2", "vocab_size": 512, "n_positions": 64, "n_embd": 64, "n_layer": 2,
    "n_head": 4, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
    "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip
H100 = PlanOptions(measure=False, device_spec=target("h100"), progress=False)


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT2))
    return path


def quietly(function, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemplanWarning)  # roofline estimates
        return function(*args, **kwargs)


def test_the_state_outside_the_graph_per_parameter_and_rank():
    adamw = TrainingState(1000, "adamw", mixed_precision=True)
    assert (adamw.optimizer_bytes, adamw.master_bytes, adamw.gathered) == (8000, 8000, 0)
    sharded = TrainingState(1000, "adamw", mixed_precision=True, ranks=8, largest_unit=300)
    # Gathered: two units' weights (running, prefetched) and the running unit's gradients.
    assert (sharded.optimizer_bytes, sharded.master_bytes, sharded.gathered) == (1000, 1000, 900)
    assert TrainingState(1000, "sgd").outside == 4000
    assert TrainingState(1000, "none").outside == 0
    with pytest.raises(MemplanError, match="optimizer must be one of adamw, sgd, none"):
        TrainingState(1, "lion")
    with pytest.raises(MemplanError, match="ranks must be at least 1"):
        TrainingState(1, ranks=0)


def _tiny_step() -> Graph:
    """w (param, 100 B) and x (input) -> y = f(w, x) (40 B) -> loss (4 B, output);
    backward from the tangent t: g = grad of w (100 B, output)."""
    nodes = (
        Node(0, "w", "param", bytes=100, kind=NodeKind.PARAM),
        Node(1, "x", "input", bytes=10, kind=NodeKind.INPUT),
        Node(2, "y", "mm", (0, 1), bytes=40, time=1.0, workspace=6),
        Node(3, "loss", "sum", (2,), bytes=4, time=1.0),
        Node(4, "t", "tangent", bytes=4, kind=NodeKind.TANGENT),
        Node(5, "g", "mm", (4, 1, 2), bytes=100, time=1.0, is_backward=True),
    )
    return Graph(nodes, outputs=(3, 5))


def test_per_rank_divides_parameters_and_returned_gradients_only():
    sharded = per_rank(_tiny_step(), 4)
    assert [n.bytes for n in sharded] == [25, 10, 40, 4, 4, 25]
    assert per_rank(_tiny_step(), 1) == _tiny_step()


def test_the_breakdown_adds_up_to_the_simulated_peak_and_the_floor_is_never_above_it():
    graph = _tiny_step()
    schedule = get_solver("keep_all")(graph, None, SolverOptions()).schedule
    trace = simulate(graph, schedule)
    parts = breakdown(graph, schedule, trace, TrainingState(50, "adamw"))
    assert parts.total - parts.optimizer_state == trace.peak
    assert parts.optimizer_state == 400
    assert parts.weights == 100
    least = floor(graph)  # w and x resident; loss and g live at the end
    assert (least.weights, least.grads, least.activations, least.total) == (100, 100, 14, 214)
    assert least.total <= trace.peak


def test_fit_plans_the_whole_step_and_its_parts_add_up(config):
    example = causal_lm(config, batch=2, seq=32)
    found = quietly(fit, example, Budget.parse("95%"), H100)
    assert found.fits and found.plan is not None and found.planned is not None
    state = training_state(example.model, "adamw", 1)
    assert found.state == state and state.optimizer_bytes == 8 * state.parameters
    # The plan holds the state outside its graph; its step peak is the breakdown's total.
    assert found.plan.outside == state.outside and found.plan.resident == 0
    assert found.plan.step_peak == found.planned.total <= found.budget
    assert found.budget == Budget.parse("95%").resolve(found.unplanned.total)
    assert found.unplanned.total == found.plan.unplanned_peak + state.outside
    assert found.bound <= found.planned.total


def test_a_plan_priced_as_inductor_fuses_is_broken_down_as_it_was_solved(config):
    # Under fused_pointwise the solvers hold no bytes for what Inductor never writes; the
    # breakdown of the plan is of that graph too, so its total is the plan's own peak.
    options = dataclasses.replace(H100, fused_pointwise=True)
    found = quietly(fit, causal_lm(config, batch=2, seq=32), Budget.parse("95%"), options)
    assert found.plan is not None and found.planned is not None
    assert found.plan.step_peak == found.planned.total


def test_a_budget_below_the_floor_is_proved_infeasible_without_a_search(config):
    example = causal_lm(config, batch=2, seq=32)
    found = quietly(fit, example, Budget.parse("40%"), H100)
    assert not found.fits and found.least is None
    assert found.bound > found.budget
    assert found.dominant() == next(iter(found.floor.parts().items()))
    # The bound is a true floor: the least peak the solver can reach is not below it.
    graph_least = quietly(
        memplan.plan, example.model, example.inputs, "1%", measure=False,
        device_spec=target("h100"), progress=False, best_effort=True,
    )  # fmt: skip
    assert graph_least.predicted_peak + found.state.outside >= found.bound


def test_the_parts_of_a_peak_at_the_first_step_are_not_negative():
    """A peak before the first step (the resident inputs alone) has no kernel running."""
    nodes = (
        Node(0, "w", "param", bytes=100, kind=NodeKind.PARAM),
        Node(1, "y", "op", (0,), bytes=1, time=1.0, workspace=50),
    )
    graph = Graph(nodes, outputs=(1,))
    schedule = get_solver("keep_all")(graph, None, SolverOptions()).schedule
    trace = simulate(graph, schedule)
    parts = breakdown(graph, schedule, trace)
    assert trace.peak_step >= -1 and min(dataclasses.astuple(parts)) >= 0
    assert parts.total == trace.peak


def test_per_rank_divides_a_gradient_returned_as_a_view_through_its_storage():
    nodes = (
        Node(0, "w", "param", bytes=100, kind=NodeKind.PARAM),
        Node(1, "y", "mm", (0,), bytes=40, time=1.0),
        Node(2, "t", "tangent", bytes=4, kind=NodeKind.TANGENT),
        Node(3, "g", "mm", (2, 1), bytes=100, time=1.0, is_backward=True),
        Node(4, "g_t", "t", (3,), bytes=0, alias_of=3, is_backward=True),
    )
    sharded = per_rank(Graph(nodes, outputs=(1, 4)), 4)
    assert [n.bytes for n in sharded] == [25, 40, 4, 25, 0]


def test_sharding_divides_what_each_rank_holds(config):
    example = causal_lm(config, batch=2, seq=32)
    whole = quietly(fit, example, Budget.parse("100%"), H100)
    sharded = quietly(fit, example, Budget.parse("100%"), H100, ranks=4)
    assert sharded.unplanned.weights == pytest.approx(whole.unplanned.weights / 4, abs=64)
    assert sharded.state.optimizer_bytes == -(-whole.state.optimizer_bytes // 4)
    assert sharded.unplanned.gathered == GATHERED_UNITS * sharded.state.largest_unit > 0
    assert sharded.unplanned.activations == whole.unplanned.activations
    assert ranks_needed(whole) == 1


def test_the_largest_batch_fits_and_the_next_does_not(config):
    budget = Budget.parse("3MiB")
    probes: dict[int, bool] = {}
    largest = quietly(
        largest_batch,
        lambda batch: causal_lm(config, batch=batch, seq=32),
        budget,
        H100,
        on_probe=lambda batch, found: probes.setdefault(batch, found.fits),
    )
    assert largest >= 1
    assert probes[largest] and not probes[largest + 1]
    with pytest.raises(MemplanError, match="needs a budget in bytes"):
        largest_batch(
            lambda batch: causal_lm(config, batch=batch, seq=32), Budget.parse("50%"), H100
        )


def test_the_fake_prediction_holds_on_the_real_model_by_the_allocator(config):
    """The fake model's plan, applied to the same model built for real: the allocator's
    peak of a planned step is within 2% of the prediction, and gradients equal eager's."""
    from test_fake_model import real_model

    fake = causal_lm(config, batch=4, seq=64)
    planned = quietly(fit, fake, Budget.parse("75%"), H100, optimizer="none")
    real = real_model(config, batch=4, seq=64)
    plan = quietly(
        memplan.plan, real.model, real.inputs, "1GiB", measure=False,
        device_spec=target("h100"), progress=False, reuse=planned.plan,
    )  # fmt: skip
    assert plan.predicted_peak == planned.plan.predicted_peak
    check = quietly(verify, real.model, real.inputs, plan)
    assert check.grads_match
    assert abs(check.measured_peak / planned.plan.predicted_peak - 1) <= 0.02


def test_the_cli_prints_the_parts_and_writes_the_plan(config, tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["plan", "--hf-config", str(config), "--seq", "32", "--batch", "2"]
    assert main([*argv, "--target", "h100", "--budget", "95%", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    for part in ("optimizer state", "weights", "activations", "peak", "budget", "fits"):
        assert part in printed
    saved = memplan.Plan.load(out)
    assert saved.outside > 0 and saved.step_peak <= saved.step_budget


def test_the_cli_says_what_dominates_where_nothing_fits(config, tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["plan", "--hf-config", str(config), "--seq", "32", "--target", "h100"]
    assert main([*argv, "--budget", "100KiB", "-o", str(out)]) == 1
    printed = " ".join(capsys.readouterr().out.split())
    assert "does not fit" in printed and "(proved:" in printed
    assert "optimizer state is the largest part" in printed
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--target", "tpu"], "unknown device 'tpu'; known: a100, h100, h200, l4"),
        ([], "--hf-config needs --target NAME or --device-spec FILE"),
        (["--target", "h100", "--dtype", "int8"], "invalid choice: 'int8'"),
        (["--target", "h100", "--max-batch"], "--max-batch needs a budget in bytes"),
    ],
)
def test_bad_fit_input_is_one_line(config, tmp_path, capsys, extra, message):
    argv = ["plan", "--hf-config", str(config), "--seq", "32", "--budget", "50%"]
    assert main([*argv, *extra, "-o", str(tmp_path / "p.json")]) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # argparse's usage precedes it
    assert message in last and last.startswith(("memplan: error:", "memplan plan: error:"))


def test_a_config_that_cannot_be_read_is_one_line(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    argv = ["plan", "--hf-config", str(bad), "--seq", "8", "--target", "h100", "--budget", "1GiB"]
    assert main([*argv, "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memplan: error:") and "cannot read the config" in err
    assert len(err.splitlines()) == 1


def needs_data(batch: int):
    """A builder that reads a tensor's value, which fake tensors do not have."""
    import torch

    scale = int(torch.ones(1).sum().item())
    return torch.nn.Linear(4 * scale, 4), (torch.ones(batch, 4),)


def test_a_builder_is_planned_on_fake_tensors(tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["plan", "--builder", "mlp", "--target", "l4", "--budget", "1GiB", "-o", str(out)]
    assert main(argv) == 0
    assert "fits" in capsys.readouterr().out
    assert memplan.Plan.load(out).name == "mlp"


def test_a_builder_that_needs_data_and_two_models_are_one_line_errors(tmp_path, capsys):
    argv = ["plan", "--builder", "test_fit:needs_data", "--target", "h100", "--budget", "1GiB"]
    assert main([*argv, "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert "cannot build it on fake tensors" in err and len(err.splitlines()) == 1
    argv = ["plan", "m.pt2", "--builder", "mlp", "--target", "h100", "--budget", "1GiB"]
    assert main([*argv, "-o", str(tmp_path / "p.json")]) == 2
    assert "give one of a MODEL file, --hf-config or --builder" in capsys.readouterr().err


def test_the_largest_fsdp_unit_is_a_block_or_the_root_with_the_rest():
    import torch
    from torch import nn

    class Decoder(nn.Module):
        def __init__(self, vocabulary: int) -> None:
            super().__init__()
            self.embed = nn.Embedding(vocabulary, 8)  # in the root's unit
            self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))  # 72 params each

    small, large = (training_state(Decoder(v), "adamw", 4) for v in (4, 100))
    assert small.largest_unit == 72 * 4  # a layer: larger than 4 x 8 embeddings
    assert large.largest_unit == 800 * 4  # the root: 100 x 8 embeddings
    assert small.parameters == 32 + 3 * 72 and not small.mixed_precision
    assert training_state(Decoder(4).to(torch.bfloat16), "sgd", 1).mixed_precision


def test_the_cli_plans_per_rank_and_says_from_how_many_ranks_the_state_fits(
    config, tmp_path, capsys
):
    argv = ["plan", "--hf-config", str(config), "--seq", "32", "--target", "h100"]
    assert main([*argv, "--budget", "2MiB", "-o", str(tmp_path / "p.json")]) == 1
    printed = " ".join(capsys.readouterr().out.split())
    assert "alone fit from --ranks" in printed
    out = tmp_path / "sharded.json"
    assert main([*argv, "--budget", "2MiB", "--ranks", "8", "-o", str(out)]) == 0
    assert "per rank of 8 (FSDP)" in " ".join(capsys.readouterr().out.split())
    assert memplan.Plan.load(out).step_peak <= 2 * 2**20


def test_the_cli_never_writes_over_its_config_or_ignores_the_fit_options(config, capsys):
    argv = ["plan", "--hf-config", str(config), "--seq", "32", "--target", "h100"]
    assert main([*argv, "--budget", "100%", "-o", str(config)]) == 2
    assert "would overwrite" in capsys.readouterr().err
    assert main(["plan", "m.pt2", "--target", "h100", "--budget", "1GiB", "-o", "p.json"]) == 2
    assert "apply only with --hf-config or --builder" in capsys.readouterr().err
    assert main(["plan", "--builder", "mlp", "--seq", "8", "--target", "h100", "--budget",
                 "1GiB", "-o", "p.json"]) == 2  # fmt: skip
    assert "--seq and --dtype apply only with --hf-config" in capsys.readouterr().err


def test_a_budget_above_the_floor_that_no_plan_meets_gives_the_least_peak_found(
    config, tmp_path, capsys
):
    example = causal_lm(config, batch=2, seq=32)
    floor_only = quietly(fit, example, Budget.parse("40%"), H100).bound
    found = quietly(fit, example, Budget(bytes=floor_only + 1), H100)
    assert not found.fits and found.least is not None
    assert found.least > found.budget >= found.bound
    out = tmp_path / "plan.json"
    argv = ["plan", "--hf-config", str(config), "--seq", "32", "--batch", "2", "--target"]
    assert main([*argv, "h100", "--budget", str(floor_only + 1), "-o", str(out)]) == 1
    assert "the least peak found is" in " ".join(capsys.readouterr().out.split())
    assert not out.exists()


def test_the_cli_finds_the_largest_batch_that_fits(config, tmp_path, capsys):
    argv = ["plan", "--hf-config", str(config), "--seq", "32", "--target", "h100"]
    out = tmp_path / "plan.json"
    assert main([*argv, "--budget", "3MiB", "--max-batch", "-o", str(out)]) == 0
    printed = " ".join(capsys.readouterr().out.split())
    largest = int(printed.split("largest batch that fits 3.00 MiB: ")[1].split()[0])
    assert largest >= 1
    assert f"batch {largest}: fits" in printed and f"batch {largest + 1}: does not fit" in printed
