"""Every private torch access of memplan, in one place.

torch gives no public way to trace a training step's joint graph for a partitioner of
one's own, to run Inductor's joint-graph passes before partitioning, to read what
Inductor's wrapper will allocate, to read the CPU allocator's events, or to know which
Dynamo frame a graph comes from. Each such access is a small function (or, for a type,
an alias) here, imported where it is called (Inductor loads slowly), and each is
smoke-tested (tests/test_compat.py), so that a torch upgrade that moves one fails there,
by name, not deep in a compile. It sits below the planner and the passes, which use it
too, and imports nothing of memplan.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch
import torch._ops
import torch.utils._pytree as _pytree
from torch.utils._python_dispatch import TorchDispatchMode as _DispatchMode

# One overload of an operator (torch.ops.aten.mm.default): what a graph's ops call.
OpOverload = torch._ops.OpOverload
# The base of a mode that sees every ATen call (planner/measure.py watches storages so).
TorchDispatchMode = _DispatchMode


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of a nest of tuples, lists and dicts (torch's pytree)."""
    return _pytree.tree_leaves(tree)


def arg_tree_leaves(*args: Any, **kwargs: Any) -> list[Any]:
    """The leaves of a call's arguments."""
    return _pytree.arg_tree_leaves(*args, **kwargs)


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    """`tree` with `fn` applied to each leaf."""
    return _pytree.tree_map(fn, tree)


def tree_flatten(tree: Any) -> tuple[list[Any], Any]:
    """The leaves of `tree` and its structure, for tree_unflatten."""
    return _pytree.tree_flatten(tree)


def tree_unflatten(leaves: Sequence[Any], structure: Any) -> Any:
    """The tree of `structure` (tree_flatten's) with `leaves`."""
    return _pytree.tree_unflatten(leaves, structure)


def aot_autograd(**kwargs: Any) -> Callable[..., Any]:
    """AOTAutograd as a Dynamo backend (torch._dynamo.backends.common)."""
    from torch._dynamo.backends.common import aot_autograd as make

    return make(**kwargs)


def lowering_backward_at_once(on: bool) -> contextlib.AbstractContextManager[None]:
    """AOTAutograd compiling the backward with the forward, not at the first backward: its
    plan is then known before the step runs."""
    import torch._functorch.config as functorch_config

    return functorch_config.patch(force_non_lazy_backward_lowering=on)


def inductor_decompositions() -> dict[Any, Callable[..., Any]]:
    """The decomposition table Inductor lowers with."""
    from torch._inductor.compile_fx import select_decomp_table

    return select_decomp_table()


def fake_mode_of(values: Sequence[Any]) -> Any:
    """The fake mode the values were traced under (None for real tensors)."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode(values)


def joint_graph_passes(joint: torch.fx.GraphModule, inputs: Sequence[Any]) -> Any:
    """Inductor's joint-graph passes on `joint` (as torch.compile's partition step runs
    them), under the trace's fake mode, for the device of the first real input."""
    from torch._inductor.fx_passes.joint_graph import joint_graph_passes as passes
    from torch._inductor.virtualized import V

    devices = (t.device for t in inputs if torch.is_tensor(t))
    device = next((d for d in devices if d.type != "meta"), None)
    with V.set_fake_mode(fake_mode_of(inputs)):
        return passes(joint, device)


def propagate_fake(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> None:
    """Each node's value traced again on fake `inputs`."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    FakeTensorProp(gm, fake_mode_of(inputs)).propagate_dont_convert_inputs(*inputs)


def inductor_settings(settings: dict[str, Any]) -> contextlib.AbstractContextManager[None]:
    """torch._inductor.config patched with `settings`."""
    from torch._inductor import config

    return config.patch(settings)


def layout_optimized(gm: torch.fx.GraphModule, settings: dict[str, Any]) -> bool:
    """Whether Inductor, under `settings`, lays `gm`'s convolutions out channels-last (its
    layout optimization, decided per graph by heuristics)."""
    from torch._inductor.graph import GraphLowering

    with inductor_settings(settings):
        return bool(GraphLowering.decide_layout_opt(gm, is_inference=False))


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
    """Inductor's compile of one forward or backward graph, as AOTAutograd calls it."""
    from torch._inductor.compile_fx import compile_fx_inner

    return compile_fx_inner(gm, list(example_inputs))


def report_output_strides(compiled: Any, example_inputs: Sequence[Any]) -> None:
    """Tell AOTAutograd the strides of a compiled forward's outputs, as Inductor's own
    compile does (the backward is compiled for them): for a compile made ahead."""
    from torch._inductor.utils import set_tracing_context_output_strides

    set_tracing_context_output_strides(example_inputs, compiled)


class WrapperLines(NamedTuple):
    """The kinds of line of Inductor's wrapper code that say what it allocates."""

    allocate: type
    reuse: type
    free_if_not_reused: type
    free: type
    reinterpret: type
    extern_alloc: type
    extern_out: type
    multi_output: type
    enter_subgraph: type


def wrapper_lines() -> WrapperLines:
    """The wrapper line classes (torch._inductor.codegen.wrapper)."""
    from torch._inductor.codegen import wrapper as w

    return WrapperLines(
        w.AllocateLine,
        w.ReuseLine,
        w.FreeIfNotReusedLine,
        w.FreeLine,
        w.ReinterpretLine,
        w.ExternKernelAllocLine,
        w.ExternKernelOutLine,
        w.MultiOutputLine,
        w.EnterSubgraphLine,
    )


class Layouts(NamedTuple):
    """The IR layouts of buffers that own no bytes of their own."""

    multi_output: type  # a fallback's tuple: its members are the buffers
    none: type  # an op that returns nothing


def layouts() -> Layouts:
    from torch._inductor import ir

    return Layouts(ir.MultiOutputLayout, ir.NoneLayout)


def is_ir_node(value: Any) -> bool:
    """Whether a lowering graph's input is a tensor (an IR node), not a size."""
    from torch._inductor import ir

    return isinstance(value, ir.IRNode)


def lowering_graph() -> Any:
    """The graph Inductor is lowering now (V.graph)."""
    from torch._inductor.virtualized import V

    return V.graph


def hint(expression: Any) -> int:
    """A size of the graph being lowered, at its hint where it is symbolic."""
    return int(lowering_graph().sizevars.optimization_hint(expression, fallback=0))


def storage_bytes(buffer: Any) -> int:
    """The bytes Inductor allocates for `buffer` (at the sizes' hints)."""
    from torch._inductor.utils import get_dtype_size

    graph = lowering_graph()
    size = graph.sizevars.optimization_hint(graph.get_allocation_storage_size(buffer), fallback=0)
    return int(size) * get_dtype_size(buffer.get_dtype())


@contextlib.contextmanager
def reading_wrapper(read: Callable[[Any], None]) -> Iterator[None]:
    """While open, `read(wrapper)` is called with each wrapper Inductor generates, right
    after it planned which buffers reuse which (its `lines` are then final), before any
    code is written."""
    from torch._inductor.codegen.wrapper import PythonWrapperCodegen

    planned = PythonWrapperCodegen.memory_plan_reuse

    def memory_plan_reuse(self: Any) -> None:
        planned(self)
        read(self)

    PythonWrapperCodegen.memory_plan_reuse = memory_plan_reuse  # type: ignore[method-assign]
    try:
        yield
    finally:
        PythonWrapperCodegen.memory_plan_reuse = planned  # type: ignore[method-assign]


class _BuiltAtFirstCall:
    """A compiled graph's wrapper module, loaded at its first call: loading it is what
    builds its kernels (each C++ or Triton kernel is compiled as the module runs)."""

    def __init__(self, load: Callable[[], Any], path: str) -> None:
        self.__file__ = path
        self.runner = _NoPartitions()
        self._load = load
        self._module: Any = None

    def call(self, args: list[Any]) -> Any:
        if self._module is None:
            self._module = self._load()
        return self._module.call(args)


class _NoPartitions:
    """The `runner` of a wrapper without partitions, `Runner(partitions=[])`, as Inductor
    reads it before a first call: nothing to apply functions to."""

    def __init__(self) -> None:
        self.partitions: list[Any] = []

    def recursively_apply_fns(self, fns: list[Any]) -> None:
        """No partition to apply `fns` to."""


# How a wrapper without partitions (cudagraph ones) makes its runner; one with partitions
# is loaded at once.
_UNPARTITIONED = "runner = Runner(partitions=[])"


@contextlib.contextmanager
def building_at_first_call() -> Iterator[None]:
    """While open, a graph Inductor compiles has its wrapper code written but not loaded:
    its kernels are built at its first call. A compile that is never called (a round the
    search does not keep) builds none."""
    from torch._inductor import config
    from torch._inductor.codecache import PyCodeCache
    from torch._inductor.graph import GraphLowering

    to_module = GraphLowering.__dict__["_compile_to_module_lines"]
    load = PyCodeCache.__dict__["load_by_key_path"]
    loaded = PyCodeCache.load_by_key_path  # bound before it is patched: a first call is after

    def deferred(key: str, path: str, *args: Any, **kwargs: Any) -> _BuiltAtFirstCall:
        # Built under the settings it was generated under (the user's, a round's lane).
        settings = config.get_config_copy()

        def load_now() -> Any:
            with config.patch(settings):
                return loaded(key, path, *args, **kwargs)

        return _BuiltAtFirstCall(load_now, path)

    def compile_to_module_lines(self: Any, wrapper_code: Any) -> Any:
        if "runner = Runner(" in wrapper_code.value and _UNPARTITIONED not in wrapper_code.value:
            return to_module(self, wrapper_code)
        PyCodeCache.load_by_key_path = staticmethod(deferred)  # type: ignore[method-assign,assignment]
        try:
            return to_module(self, wrapper_code)
        finally:
            PyCodeCache.load_by_key_path = load  # type: ignore[method-assign]

    GraphLowering._compile_to_module_lines = compile_to_module_lines  # type: ignore[method-assign]
    try:
        yield
    finally:
        GraphLowering._compile_to_module_lines = to_module  # type: ignore[method-assign]


def current_compile_id() -> Any:
    """The id of the Dynamo compile in progress (frame id, compile count), or None."""
    return torch._guards.CompileContext.current_compile_id()


def torch_compile_wrapper_code() -> Any:
    """The code of torch.compile's wrapper around a backend: the frame that calls a
    backend by name on behalf of one torch.compile call."""
    return torch._TorchCompileWrapper.__call__.__code__


def autograd_function_node() -> type:
    """The class of the autograd node of a custom Function (AOTAutograd's)."""
    from torch.autograd.function import BackwardCFunction

    return BackwardCFunction


def real_tensors() -> contextlib.AbstractContextManager[Any]:
    """No fake mode while inside: tensors made are real, though a trace's fake mode is on
    (AOTAutograd's partition step)."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def is_op_overload(op: object) -> bool:
    """Whether `op` is one overload of an operator (torch.ops.aten.mm.default)."""
    return isinstance(op, OpOverload)


def is_sym_node(node: torch.fx.Node) -> bool:
    """Whether a traced graph's node is a size (a SymInt), not a tensor."""
    from torch._functorch.partitioners import is_sym_node as sym

    return bool(sym(node))


def fake_tensor_mode() -> Any:
    """A new fake mode: tensors made inside it have sizes and no storage."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


def joint_exporter() -> Callable[..., Any]:
    """AOTAutograd's export of a training step's joint graph, with descriptors of its
    inputs and outputs (aot_export_joint_with_descriptors)."""
    from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

    return aot_export_joint_with_descriptors


def joint_compiler() -> Callable[..., Any]:
    """AOTAutograd's compile of an exported joint graph, partitioned by a function of
    one's own (aot_compile_joint_with_descriptors)."""
    from torch._functorch.aot_autograd import aot_compile_joint_with_descriptors

    return aot_compile_joint_with_descriptors


def compiling_for_torch_compile() -> contextlib.AbstractContextManager[Any]:
    """A trace as torch.compile's: inside, torch.compiler.is_compiling() is true (a
    library that takes another path under it takes it here too)."""
    return torch.compiler._compile_session_context()


def saved_tensors_hooks() -> tuple[Any, Any] | None:
    """The innermost saved-tensors hooks (pack, unpack) in force, or None."""
    return torch._C._autograd._top_saved_tensors_default_hooks(True)


def backward_metadata() -> Any:
    """AOTAutograd's metadata of the step being compiled (its fw_metadata), or None
    outside a compile."""
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    return None if context is None else context.fw_metadata


def profiler_running() -> bool:
    """Whether a torch.profiler session records now."""
    return bool(torch._C._autograd._profiler_enabled())


def allocation_event() -> Any:
    """The tag of an allocation event in the profiler's event tree."""
    from torch._C._profiler import _EventType

    return _EventType.Allocation


def post_grad_pass(run: Callable[[torch.fx.Graph], None], name: str) -> Any:
    """`run` as a pass Inductor runs on each graph after its own post-grad passes (the
    setting post_grad_custom_post_pass), named `name` in its cache key and when printed
    (a plan's cache key prints the settings)."""
    from torch._inductor.custom_graph_pass import CustomGraphPass

    class _Pass(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            run(graph)

        def uuid(self) -> str:
            return name

        def __repr__(self) -> str:
            return name

    return _Pass()


def min_cut_partitioner() -> Callable[..., Any]:
    """torch.compile's own partitioner (min_cut_rematerialization_partition)."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    return min_cut_rematerialization_partition


def activation_memory_budget(budget: float) -> contextlib.AbstractContextManager[None]:
    """torch.compile's partitioner held to `budget` (its activation_memory_budget)."""
    import torch._functorch.config as functorch_config

    return functorch_config.patch(activation_memory_budget=budget)


def is_fake(value: Any) -> bool:
    """Whether `value` is a fake tensor."""
    from torch._subclasses.fake_tensor import is_fake as fake

    return bool(fake(value))


# Every accessor above, for the smoke test: each must return without error on the torch
# memplan supports.
SMOKE = (
    inductor_decompositions,
    wrapper_lines,
    layouts,
    torch_compile_wrapper_code,
    autograd_function_node,
    fake_tensor_mode,
    joint_exporter,
    joint_compiler,
    allocation_event,
    compiling_for_torch_compile,
    min_cut_partitioner,
)
