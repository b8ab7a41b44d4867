"""Planned models under torch.distributed: 2 gloo ranks on CPU train them with DDP and FSDP2
to exactly the gradients and weights of the unplanned distributed runs.

Both ranks run every scenario in one spawn (process start and imports dominate the time);
each writes its results to a file and the assertions run here, in the pytest process.
"""

from __future__ import annotations

import fcntl
import math
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

import memplan
from memplan.compile.backend import MemplanBackend
from memplan.planner.plan_file import Plan

pytestmark = pytest.mark.skipif(
    not dist.is_available() or not dist.is_gloo_available(),
    reason="torch.distributed with the gloo backend is not available in this torch build",
)

WORLD = 2
STEPS = 2
LR = 0.1
WIDTH, BATCH, BLOCKS = 128, 512, 3
BUDGET = "80%"
# Float64 so that comparisons can be this tight: the planned graphs run decomposed ATen ops,
# which may round differently from eager's fused kernels; today the results are bitwise
# equal, and a lost gradient sync or a wrong recompute is off by far more than this.
TOLERANCE = {"rtol": 1e-12, "atol": 1e-14}
# DDPOptimizer caps its first bucket at 1 MiB (dist._DEFAULT_FIRST_BUCKET_BYTES) and requires
# the other buckets to be at least that big; the model's 1.6 MB of parameters make 2 buckets.
BUCKET_CAP_MB = 1

DDP_RUNS = ["ddp_api", "ddp_api_shared_plan", "ddp_compile"]
FSDP_RUNS = ["fsdp_api", "fsdp_compile", "fsdp_block_compile"]


class Block(nn.Module):
    """A residual stack of Linear+GELU layers: deep enough that its own graph, planned alone
    (FSDP2 with a compiled block), has activations worth recomputing."""

    def __init__(self, width: int, depth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        for layer in self.layers:
            y = nn.functional.gelu(layer(y))
        return x + y


class Net(nn.Module):
    """Blocks and a classifier head; forward returns the loss, as the zoo's models do."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(WIDTH) for _ in range(BLOCKS))
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return nn.functional.cross_entropy(self.head(x), target)


def new_net() -> Net:
    torch.manual_seed(0)  # the same initial weights on every rank and in every run
    return Net().double()


def rank_batch(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    x = torch.randn(BATCH, WIDTH, generator=generator, dtype=torch.float64)
    return x, torch.randint(0, 10, (BATCH,), generator=generator)


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: FSDP2 holds sharded parameters and gradients as DTensors."""
    if isinstance(tensor, dist.tensor.DTensor):
        tensor = tensor.full_tensor()
    return tensor.detach().clone()


def train(model: nn.Module, step: Any, inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    """STEPS SGD steps of `step(*inputs)`; gradients of each step and the final weights, read
    from `model` (the user's module, whatever wraps it)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    grads = []
    for _ in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        step(*inputs).backward()
        grads.append({n: full(p.grad) for n, p in model.named_parameters()})
        optimizer.step()
    return {"grads": grads, "weights": {n: full(p) for n, p in model.named_parameters()}}


def plans_of(plans: list[Plan]) -> list[dict[str, Any]]:
    return [
        {
            "status": p.status,
            "budget": p.budget,
            "unplanned_peak": p.unplanned_peak,
            "predicted_peak": p.predicted_peak,
            "resident": p.resident,
            "unplanned_step_peak": p.unplanned_step_peak,
            "decisions": dict(p.decisions),
            "counts": p.counts(),
        }
        for p in plans
    ]


def optimize(model: nn.Module, inputs: tuple[torch.Tensor, ...], **options: Any) -> Any:
    # measure=False: the roofline estimate, identical on every rank, so the ranks' plans
    # match; measured times differ between processes and could tip the solver apart.
    return memplan.optimize(model, inputs, budget=BUDGET, progress=False, measure=False, **options)


def backend() -> MemplanBackend:
    torch._dynamo.reset()
    # The eager runner: the planned graphs as the API runs them, so that the compiled runs'
    # plans and gradients compare exactly with the API's (Inductor fuses and reorders).
    return memplan.backend(budget=BUDGET, inner="eager", progress=False, measure=False)


def ddp_runs(rank: int, inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    from torch.nn.parallel import DistributedDataParallel as DDP

    out: dict[str, Any] = {}
    model = new_net()
    out["ddp"] = train(model, DDP(model), inputs)

    model = new_net()
    planned = optimize(model, inputs)
    out["ddp_api"] = {**train(model, DDP(planned), inputs), "plans": plans_of([planned.plan])}

    # Plan once on rank 0 and apply its decisions everywhere.
    model = new_net()
    shared = [optimize(model, inputs).plan if rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    planned = optimize(model, inputs, reuse=shared[0])
    out["ddp_api_shared_plan"] = {
        **train(model, DDP(planned), inputs),
        "plans": plans_of([planned.plan]),
    }

    model = new_net()
    planner = backend()
    compiled = torch.compile(DDP(model, bucket_cap_mb=BUCKET_CAP_MB), backend=planner)
    out["ddp_compile"] = {**train(model, compiled, inputs), "plans": plans_of(planner.plans)}
    return out


def fsdp_runs(inputs: tuple[torch.Tensor, ...]) -> dict[str, Any]:
    from torch.distributed.fsdp import fully_shard

    out: dict[str, Any] = {}
    model = new_net()
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    out["fsdp"] = train(model, model, inputs)

    # Plan first, then shard the planned module as one unit: memplan cannot trace a sharded
    # model, and the planned graphs bypass the submodules' forwards (and so their hooks).
    model = new_net()
    planned = optimize(model, inputs)
    fully_shard(planned)
    out["fsdp_api"] = {**train(model, planned, inputs), "plans": plans_of([planned.plan])}

    # One FSDP unit: Dynamo captures the whole step between FSDP's (skipped) hooks.
    model = new_net()
    fully_shard(model)
    planner = backend()
    compiled = torch.compile(model, backend=planner)
    out["fsdp_compile"] = {**train(model, compiled, inputs), "plans": plans_of(planner.plans)}

    # The usual recipe: shard and compile each block; each block's graph is planned.
    model = new_net()
    planner = backend()
    for block in model.blocks:
        fully_shard(block)
        block.compile(backend=planner)
    fully_shard(model)
    out["fsdp_block_compile"] = {
        **train(model, model, inputs),
        "plans": plans_of(planner.plans),
        "names": [p.name for p in planner.plans],
    }
    return out


def worker(rank: int, store: str, out_dir: str) -> None:
    torch.set_num_threads(1)  # two ranks share the machine's cores
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=WORLD,
        timeout=timedelta(seconds=120),
    )
    try:
        inputs = rank_batch(rank)
        local = new_net()
        results = {"local": train(local, local, inputs)}  # no communication
        results.update(ddp_runs(rank, inputs))
        results.update(fsdp_runs(inputs))
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Each rank's results, from one spawn per test run; mp.spawn raises (with the rank's
    traceback) if a rank fails.

    Under xdist the module's tests are spread over the workers, and each worker would spawn
    its own ranks (about 40 s of both cores each). So the workers share one spawn through
    the run's own temporary directory: the first to get its lock spawns, the others wait
    for it and read its files, or where it failed, raise its error without spawning again
    (a second spawn found the failed one's file store and waited on it: a rank that died
    of SIGSEGV once, in a fresh clone on 2026-12-07, held the run for 8 minutes). Without
    xdist that directory's parent holds earlier runs' too, so the fixture spawns into a
    directory of its own."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        root = tmp_path_factory.mktemp("distributed")
        spawn(root)
    else:
        root = tmp_path_factory.getbasetemp().parent / "distributed"
        root.mkdir(exist_ok=True)
        failed = root / "failed"
        with open(root / "lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
            if failed.exists():
                raise RuntimeError(f"the other worker's spawn failed: {failed.read_text()}")
            if not (root / "done").exists():
                try:
                    spawn(root)
                except Exception as error:
                    failed.write_text(f"{type(error).__name__}: {error}")
                    raise
                (root / "done").touch()
    return [torch.load(root / f"rank{r}.pt") for r in range(WORLD)]


def spawn(root: Path) -> None:
    """A spawn of WORLD ranks, each writing its results to `root`."""
    mp.spawn(worker, args=(str(root / "store"), str(root)), nprocs=WORLD, join=True)


def assert_same_training(got: dict[str, Any], expected: dict[str, Any], what: str) -> None:
    assert len(got["grads"]) == len(expected["grads"]) == STEPS
    for step, (grads, want) in enumerate(zip(got["grads"], expected["grads"], strict=True)):
        assert grads.keys() == want.keys()
        for name in want:
            torch.testing.assert_close(
                grads[name], want[name], **TOLERANCE, msg=f"{what}: grad {name} step {step}"
            )
    assert got["weights"].keys() == expected["weights"].keys()
    for name, weight in expected["weights"].items():
        torch.testing.assert_close(
            got["weights"][name], weight, **TOLERANCE, msg=f"{what}: weight {name}"
        )


def test_ranks_see_different_data_and_the_unplanned_runs_sync_them(ranks) -> None:
    """The reference runs are synchronized, and syncing changes the gradients, so the
    comparisons below would catch a planned model whose gradients were not reduced."""
    local = [r["local"]["grads"][0] for r in ranks]
    name = "head.weight"
    assert not torch.allclose(local[0][name], local[1][name])
    for reference in ["ddp", "fsdp"]:
        assert_same_training(ranks[1][reference], ranks[0][reference], f"{reference} rank 1")
        synced = ranks[0][reference]["grads"][0][name]
        torch.testing.assert_close(synced, (local[0][name] + local[1][name]) / 2, **TOLERANCE)
        assert not torch.allclose(synced, local[0][name])
    # DDP and FSDP2 average the same gradients: both references train the same model.
    assert_same_training(ranks[0]["fsdp"], ranks[0]["ddp"], "fsdp vs ddp")


@pytest.mark.parametrize(
    ("run", "reference"),
    [(run, "ddp") for run in DDP_RUNS] + [(run, "fsdp") for run in FSDP_RUNS],
)
def test_planned_run_trains_like_the_unplanned_one(ranks, run: str, reference: str) -> None:
    for rank, results in enumerate(ranks):
        assert_same_training(results[run], results[reference], f"{run} rank {rank}")


@pytest.mark.parametrize("run", DDP_RUNS + FSDP_RUNS)
def test_each_rank_planned_within_the_budget_and_recomputes(ranks, run: str) -> None:
    """The budget bites (something is recomputed), the ranks, which trace the same shapes,
    made the same plans, and every graph is planned for the step's budget: a share of the
    step's unplanned peak, less what the graphs before it keep resident. A single graph
    meets it; of several (DDP's buckets, FSDP's blocks), later ones may be left with less
    than their least, which they are then planned for (best effort)."""
    fraction = float(BUDGET.rstrip("%")) / 100
    for results in ranks:
        plans = results[run]["plans"]
        assert plans
        for plan in plans:
            assert plan["predicted_peak"] <= plan["budget"], plan
            step_budget = math.ceil(fraction * plan["unplanned_step_peak"]) - plan["resident"]
            if plan["status"] != "best-effort":
                assert plan["budget"] == step_budget, plan
            else:
                assert len(plans) > 1 and plan["budget"] > step_budget, plan
        assert sum(plan["counts"]["recompute"] for plan in plans) > 0
    assert ranks[0][run]["plans"] == ranks[1][run]["plans"]


def test_ddp_under_torch_compile_plans_each_bucket_graph(ranks) -> None:
    """DDPOptimizer splits the step at bucket boundaries; memplan plans each piece."""
    assert len(ranks[0]["ddp_compile"]["plans"]) >= 2


def test_fsdp_plans_see_the_unsharded_parameters(ranks) -> None:
    """FSDP gathers a unit's parameters before its forward: the one-unit compiled graph is
    planned exactly as the unsharded model is through the API."""
    assert ranks[0]["fsdp_compile"]["plans"] == ranks[0]["ddp_api"]["plans"]


def test_fsdp_block_compile_plans_the_blocks(ranks) -> None:
    """Each block's graph is planned when Dynamo compiles it (the watch of what earlier
    calls hold may plan one again: named for why, "graph1 (least, for the step)")."""
    (plan,) = ranks[0]["fsdp_api"]["plans"]
    block_plans = ranks[0]["fsdp_block_compile"]["plans"]
    compiled = [name for name in ranks[0]["fsdp_block_compile"]["names"] if "(" not in name]
    assert 1 <= len(compiled) <= BLOCKS
    for block_plan in block_plans:
        assert block_plan["unplanned_peak"] < plan["unplanned_peak"]


def test_shared_plan_is_rank_zeros_plan(ranks) -> None:
    assert ranks[1]["ddp_api_shared_plan"]["plans"] == ranks[0]["ddp_api"]["plans"]
