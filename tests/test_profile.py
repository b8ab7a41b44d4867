"""Per-node times and transient memory of fx graphs: measured, estimated, and the on-disk
cache."""

from __future__ import annotations

import contextlib
import json
import operator
import warnings

import pytest
import torch
from torch import fx
from torch._functorch.aot_autograd import aot_export_joint_with_descriptors
from torch.fx.experimental.proxy_tensor import make_fx

from memplan.core import config, devices
from memplan.core.errors import MemplanWarning
from memplan.planner import profile, roofline
from memplan.planner.measure import measure_peak
from memplan.planner.pass_values import meta_bytes
from memplan.planner.profile import ProfileCache, profile_graph
from memplan.planner.profile_cache import Cost
from memplan.planner.roofline import device_spec, estimated_workspace, roofline_seconds

CPU = torch.device("cpu")
FAST = {"device": CPU, "repeats": 2, "warmup": 1, "progress": False}


@pytest.fixture(scope="module")
def joint() -> fx.GraphModule:
    """The forward+backward graph of a small MLP; layer_norm's tuple output gives getitems."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.LayerNorm(32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    )
    with contextlib.ExitStack() as stack:
        return aot_export_joint_with_descriptors(stack, model, (torch.randn(8, 16),)).graph_module


def _tensor_work(gm: fx.GraphModule) -> list[fx.Node]:
    return [
        n for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem
    ]


@pytest.fixture
def measures(monkeypatch) -> list[int]:
    """Counts measuring passes over whole graphs."""
    calls: list[int] = []
    real = profile._measure

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(profile, "_measure", counted)
    return calls


@pytest.mark.parametrize("measure", [True, False])
def test_every_op_gets_a_time_and_the_rest_zero(joint, measure):
    found = profile_graph(joint, measure=measure, **FAST)
    times = found.seconds
    assert set(times) == set(found.workspace) == {n.name for n in joint.graph.nodes}
    assert found.estimated == ()
    work = _tensor_work(joint)
    assert any(n.target is operator.getitem for n in joint.graph.nodes)
    assert all(times[n.name] > 0 for n in work)
    assert all(times[n.name] == 0.0 for n in joint.graph.nodes if n not in work)


def test_profiling_leaves_the_random_state_as_it_was(joint):
    """Made-up values come from the pool's own generator: a step that profiles draws the
    same dropout masks as one that does not."""
    state = torch.get_rng_state()
    profile_graph(joint, **FAST)
    assert torch.equal(torch.get_rng_state(), state)


def test_roofline_of_a_matmul_is_compute_bound():
    gm = make_fx(torch.mm, tracing_mode="fake")(torch.randn(512, 512), torch.randn(512, 512))
    (mm,) = _tensor_work(gm)
    spec = device_spec(CPU)
    # 2 * 512^3 FLOPs at 5e10 FLOP/s beats 3 * 1 MiB at 1e10 B/s
    expected = 2 * 512**3 / spec.float32_flops + spec.launch_overhead
    assert profile_graph(gm, device=CPU, measure=False).seconds[mm.name] == pytest.approx(expected)


def test_a_views_roofline_is_its_launch_overhead():
    gm = make_fx(lambda x: x.view(-1), tracing_mode="fake")(torch.randn(1024, 1024))
    (view,) = _tensor_work(gm)
    assert roofline_seconds(view, device_spec(CPU)) == device_spec(CPU).launch_overhead


def test_symbolic_shapes_run_and_size_queries_cost_nothing():
    def f(x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], -1) * 2

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(4, 3, 2))
    times = profile_graph(gm, **FAST).seconds
    sizes = [n for n in gm.graph.nodes if n.target is torch.ops.aten.sym_size.int]
    assert sizes
    assert all(times[n.name] == 0.0 for n in sizes)
    assert all(times[n.name] > 0 for n in gm.graph.nodes if n.target is torch.ops.aten.mul.Tensor)


def test_a_node_that_fails_gets_a_roofline_and_the_rest_still_run(tmp_path):
    gm = make_fx(lambda x: (x + 1) * 2, tracing_mode="fake")(torch.randn(64))
    add = next(n for n in gm.graph.nodes if n.target is torch.ops.aten.add.Tensor)

    def unrunnable(*args: object) -> torch.Tensor:
        raise RuntimeError("no kernel for this device")

    add.target = unrunnable  # keeps add's meta["val"], from which its output is made up
    cache = ProfileCache(tmp_path / "p.json")
    with pytest.warns(MemplanWarning, match=rf"could not run alone on cpu \({add.name}\)"):
        found = profile_graph(gm, cache=cache, **FAST)
    assert found.estimated == (add.name,)
    assert found.seconds[add.name] == roofline_seconds(add, device_spec(CPU))
    assert found.workspace[add.name] == estimated_workspace(add)
    assert len(json.loads(cache.path.read_text())) == 1  # the mul; estimates are not cached


def test_a_warm_cache_measures_nothing(joint, tmp_path, measures):
    first = profile_graph(joint, cache=ProfileCache(tmp_path / "p.json"), **FAST)
    second = profile_graph(joint, cache=ProfileCache(tmp_path / "p.json"), **FAST)
    assert len(measures) == 1
    assert second == first  # costs are pooled per key, so a cached run returns the same


def test_without_a_cache_every_call_measures(joint, measures):
    profile_graph(joint, **FAST)
    profile_graph(joint, device=CPU, repeats=1, warmup=0)  # the bar, off: stdout is captured
    assert len(measures) == 2


def test_a_corrupt_cache_file_is_replaced(joint, tmp_path, measures):
    path = tmp_path / "p.json"
    path.write_text('{"half a')
    profile_graph(joint, cache=ProfileCache(path), **FAST)
    assert len(measures) == 1
    entries = json.loads(path.read_text())
    assert entries and all(isinstance(s, float) and isinstance(w, int) for s, w in entries.values())


def test_the_cache_lands_in_memplan_cache_dir(joint, tmp_path, monkeypatch):
    monkeypatch.setenv("MEMPLAN_CACHE_DIR", str(tmp_path / "cache"))
    profile_graph(joint, cache=ProfileCache(), **FAST)
    names = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert names == ["profile-v2.json", "profile-v2.json.lock"]


def test_two_processes_updating_one_cache_keep_each_other_s_entries(tmp_path):
    """Each cache read the file before the other wrote to it (two test workers, or two
    jobs, profiling at once): the second writer keeps the first one's entries."""
    path = tmp_path / "p.json"
    first, second = ProfileCache(path), ProfileCache(path)
    assert first.get("a") is None and second.get("b") is None  # both read the empty file
    first.update({"a": Cost(1.0, 0)})
    second.update({"b": Cost(2.0, 8)})
    assert ProfileCache(path).get("a") == Cost(1.0, 0)
    assert ProfileCache(path).get("b") == Cost(2.0, 8)
    assert second.get("a") == Cost(1.0, 0)  # and the writer now knows them too


def test_a_key_s_first_cost_stays(tmp_path):
    """A cost measured again for a cached key (another process profiling a graph that
    shares it) does not replace the first: plans made with it would otherwise differ from
    the next plan of the same graph."""
    path = tmp_path / "p.json"
    first, second = ProfileCache(path), ProfileCache(path)
    assert first.get("a") is None and second.get("a") is None  # both read the empty file
    assert first.update({"a": Cost(1.0, 0)}) == {"a": Cost(1.0, 0)}
    stored = second.update({"a": Cost(5.0, 4), "b": Cost(2.0, 8)})
    assert stored == {"a": Cost(1.0, 0), "b": Cost(2.0, 8)}
    assert ProfileCache(path).get("a") == Cost(1.0, 0)


def test_a_partly_cached_graph_keeps_its_cached_costs(joint, tmp_path, measures):
    path = tmp_path / "p.json"
    profile_graph(joint, cache=ProfileCache(path), **FAST)
    nodes = _tensor_work(joint)
    kept, dropped = (profile.node_key(n, CPU) for n in (nodes[0], nodes[-1]))
    entries = json.loads(path.read_text())
    entries[kept] = [7.0, 3]  # no measurement reads this
    del entries[dropped]
    path.write_text(json.dumps(entries))
    found = profile_graph(joint, cache=ProfileCache(path), **FAST)
    assert len(measures) == 2  # the dropped key made the graph run again
    assert (found.seconds[nodes[0].name], found.workspace[nodes[0].name]) == (7.0, 3)
    assert 0 < found.seconds[nodes[-1].name] < 7.0
    assert ProfileCache(path).get(dropped) is not None


def test_cache_dir_defaults_to_the_users_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("MEMPLAN_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert config.cache_dir() == tmp_path / ".cache" / "memplan"


def test_gpu_specs_come_from_the_name_table(monkeypatch):
    monkeypatch.setattr(roofline, "device_name", lambda device: "NVIDIA H100 80GB HBM3")
    assert device_spec(torch.device("cuda")) == devices.target("h100")
    monkeypatch.setattr(roofline, "device_name", lambda device: "NVIDIA L40S")
    assert device_spec(torch.device("cuda")) == devices.UNKNOWN_GPU  # not an L4
    monkeypatch.setattr(roofline, "device_name", lambda device: "NVIDIA A100-SXM4-40GB")
    assert device_spec(torch.device("cuda")) == devices.UNKNOWN_GPU  # not the 80GB card


def test_an_unsafe_view_copies_nothing_in_the_roofline():
    gm = make_fx(lambda x: torch.ops.aten._unsafe_view(x, (-1,)), tracing_mode="fake")(
        torch.randn(1024, 1024)
    )
    (view,) = _tensor_work(gm)
    assert roofline_seconds(view, device_spec(CPU)) == device_spec(CPU).launch_overhead


@pytest.fixture(scope="module")
def deep_joint() -> fx.GraphModule:
    """The forward+backward graph of eight layers of width 512 on 256 rows: what the
    forward saves for the backward (about 4 MiB) outweighs any one node's values."""
    torch.manual_seed(0)
    layers = [m for _ in range(8) for m in (torch.nn.Linear(512, 512), torch.nn.Tanh())]
    model = torch.nn.Sequential(*layers)
    with contextlib.ExitStack() as stack:
        export = aot_export_joint_with_descriptors(stack, model, (torch.randn(256, 512),))
        return export.graph_module


def _profile_peak(gm: fx.GraphModule, cap: int | None) -> tuple[int, set[str]]:
    """The allocator's peak while `gm` is profiled with `cap`, and the nodes timed."""
    found: list[profile.Profile] = []

    def run() -> None:
        with warnings.catch_warnings():  # inside the recording, transients are bounds
            warnings.simplefilter("ignore", MemplanWarning)
            found.append(profile_graph(gm, cap=cap, **FAST))

    peak = measure_peak(run, resident=(), device=CPU).peak_bytes
    return peak, {name for name, s in found[0].seconds.items() if s > 0}


def test_a_capped_profile_holds_its_cap_and_times_every_node(deep_joint):
    """Profiled as written, a pass holds what the step holds unplanned and copies of the
    inputs; with a cap it lets values go (read again farthest ahead first) and makes them
    up again when read, and holds the cap (at most one node's output over it), timing
    the same nodes."""
    free, timed = _profile_peak(deep_joint, None)
    biggest = max(meta_bytes(n) for n in deep_joint.graph.nodes if n.op != "output")
    cap = free // 3
    capped, timed_capped = _profile_peak(deep_joint, cap)
    assert free > 2 * cap  # the cap binds: 18.91 MB as written (2-core CPU, 2026-12-01)
    assert capped <= cap + biggest, (capped, cap, biggest)
    assert timed_capped == timed and timed
