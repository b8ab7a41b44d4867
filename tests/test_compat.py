"""Every private torch access of memplan (memplan/compat.py), smoke-tested by name: a torch
upgrade that moves one fails here, not deep in a compile."""

from __future__ import annotations

import types

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from memplan import compat
from memplan.compile import inductor
from memplan.compile.inductor import NotEmittable, compile_reading
from memplan.core.emitted import Allocate, Kernel, Release


@pytest.mark.parametrize("accessor", compat.SMOKE, ids=lambda f: f.__name__)
def test_each_private_symbol_is_where_memplan_reads_it(accessor):
    assert accessor() is not None


def test_the_wrapper_lines_have_the_fields_memplan_reads():
    lines = compat.wrapper_lines()
    fields = {
        lines.allocate: ("node",),
        lines.reuse: ("node", "reused_as", "delete_old"),
        lines.free_if_not_reused: ("node", "is_reused"),
        lines.free: ("node",),
        lines.reinterpret: ("node", "reused_as"),
        lines.multi_output: ("result_name", "arg_name"),
    }
    for kind, names in fields.items():
        declared = getattr(kind, "__dataclass_fields__", {})
        assert all(name in declared for name in names), (kind, names)


def test_the_compile_id_is_none_outside_a_compile_and_the_wrapper_is_code():
    assert compat.current_compile_id() is None
    assert isinstance(compat.torch_compile_wrapper_code(), types.CodeType)
    assert compat.is_fake(FakeTensorMode().from_tensor(torch.ones(2)))
    assert not compat.is_fake(torch.ones(2))


def test_outside_a_compile_or_a_profile_there_is_nothing_to_read():
    assert compat.backward_metadata() is None
    assert compat.saved_tensors_hooks() is None
    assert not compat.profiler_running()
    with torch.profiler.profile():
        assert compat.profiler_running()


def test_a_post_grad_pass_is_named_in_the_cache_key_and_runs_on_the_graph():
    seen = []
    made = compat.post_grad_pass(seen.append, "memplan.test")
    assert made.uuid() == repr(made) == "memplan.test"
    graph = torch.fx.Graph()
    made(graph)
    assert seen == [graph]


def test_a_nest_is_flattened_and_mapped_as_torch_does():
    nest = (1, [2, {"a": 3}])
    leaves, structure = compat.tree_flatten(nest)
    assert leaves == compat.tree_leaves(nest) == [1, 2, 3]
    assert compat.tree_unflatten([4, 5, 6], structure) == (4, [5, {"a": 6}])
    assert compat.tree_map(lambda x: x * 2, nest) == (2, [4, {"a": 6}])
    assert compat.arg_tree_leaves(1, [2], b=(3,)) == [1, 2, 3]


def test_an_op_overload_is_told_and_tensors_are_real_inside_a_fake_mode():
    assert compat.is_op_overload(torch.ops.aten.mm.default)
    assert not compat.is_op_overload(torch.ops.aten.mm)  # the packet, not an overload
    with FakeTensorMode():
        assert compat.is_fake(torch.ones(2))
        with compat.real_tensors():
            assert not compat.is_fake(torch.ones(2))


def _traced() -> torch.fx.GraphModule:
    """x -> (x * 2).sin() + 1 on a 1 MiB input, in ATen ops, its values traced on fake
    tensors and traced again (compat.propagate_fake)."""
    gm = make_fx(lambda x: ((x * 2).sin() + 1,), tracing_mode="fake")(torch.ones(512, 512))
    inputs = [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")]
    compat.propagate_fake(gm, inputs)
    return gm


def test_an_inductor_compile_is_read_and_runs():
    """Inductor fuses the three ops into one kernel: one buffer of 1 MiB, returned, and a
    compiled graph that computes the result."""
    read = compile_reading(_traced(), {})
    compiled, emitted, specs = read.compiled, read.emitted, read.specs
    made = [e for e in emitted.events if isinstance(e, Allocate)]
    assert [e.bytes for e in made] == [2**20]
    assert not any(isinstance(e, Release) and e.name == made[0].name for e in emitted.events)
    assert emitted.outputs == (made[0].name,) and specs[0][0] == (512, 512)
    x = torch.ones(512, 512)
    (result,) = compiled([x])
    torch.testing.assert_close(result, (x * 2).sin() + 1)


def test_a_read_compile_builds_its_kernels_at_its_first_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round the search does not keep is never called: its kernels are never built
    (compat.building_at_first_call). The kept one builds them as it is first called."""
    from torch._inductor.async_compile import AsyncCompile

    built: list[str] = []
    build = AsyncCompile.cpp_pybinding

    def counted(self: AsyncCompile, argtypes: list[str], source_code: str) -> object:
        built.append(source_code)
        return build(self, argtypes, source_code)

    monkeypatch.setattr(AsyncCompile, "cpp_pybinding", counted)
    read = compile_reading(_traced(), {})
    assert built == []
    x = torch.ones(512, 512)
    (result,) = read.compiled([x])
    assert len(built) == 1
    torch.testing.assert_close(result, (x * 2).sin() + 1)


def test_a_wrapper_that_cannot_be_read_raises_not_emittable_not_inductors_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What the reading refuses reaches the rounds as NotEmittable (they warn and keep the
    unfused prediction), not wrapped in the error Inductor raises for a failed compile."""

    def refuse(*_: object) -> None:
        raise NotEmittable("a graph with subgraphs (control flow) cannot be read")

    monkeypatch.setattr(inductor, "_read", refuse)
    with pytest.raises(NotEmittable, match="subgraphs"):
        compile_reading(_traced(), {})


def test_a_products_kernel_names_its_own_op_not_the_ops_fused_ahead_of_it():
    """Inductor's origins of a batched product also name the pointwise ops that made its
    input, fused into a kernel of their own. The product's kernel event names the product
    alone: it holds its own op's workspace, not the unfused workspace of those ops (an
    `fma` the unfused graph profiled at 4 MiB per product on a T5)."""

    def product(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor]:
        return (torch.bmm((a * b).sin() + a, b.permute(0, 2, 1)),)

    x = torch.ones(4, 64, 64)
    gm = make_fx(product, tracing_mode="fake")(x, x)
    compat.propagate_fake(gm, [n.meta["val"] for n in gm.graph.find_nodes(op="placeholder")])
    kernels = [e for e in compile_reading(gm, {}).emitted.events if isinstance(e, Kernel)]
    assert [k.origins for k in kernels] == [("bmm",)]


def test_inductor_lays_out_a_convolution_graph_channels_last_unless_told_not_to():
    """compat.layout_optimized asks Inductor's own heuristic: on a CPU, a graph with a 2-D
    convolution is laid out channels-last, unless the setting is off; one without
    convolutions is not."""
    conv = make_fx(lambda x, w: (torch.nn.functional.conv2d(x, w),), tracing_mode="fake")(
        torch.ones(2, 3, 8, 8), torch.ones(4, 3, 3, 3)
    )
    assert compat.layout_optimized(conv, {})
    assert not compat.layout_optimized(conv, {"layout_optimization": False})
    assert not compat.layout_optimized(_traced(), {})
