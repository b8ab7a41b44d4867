"""Capture: the joint forward+backward graph of a module, through AOTAutograd.

The joint graph is functionalized, decomposed ATen with a FakeTensor `val` on every node.
memplan plans inside the partition function AOTAutograd calls on that graph, so the
graph it plans is exactly the graph that runs, for the Python API, the .pt2 path and
torch.compile alike.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.fx.traceback as fx_traceback
from torch import nn
from torch.overrides import TorchFunctionMode

from memplan import compat
from memplan.core.errors import UnsupportedModel, first_line

# AOTAutograd's partition hook: (joint_module, joint_inputs, *, num_fwd_outputs, ...) -> (fw, bw)
PartitionFn = Callable[..., tuple[torch.fx.GraphModule, torch.fx.GraphModule]]
# An op -> its decomposition table, as AOTAutograd takes it.
Decompositions = dict[compat.OpOverload, Callable[..., Any]]


@dataclass
class Compiled:
    """A module's training step compiled with a given partition function."""

    fn: Callable[..., Any]  # takes (*params, *buffers, *inputs)
    param_names: list[str]
    buffer_names: list[str]


# The key of fx's annotations (node.meta["custom"]) under which capture marks the nodes
# traced inside a torch.utils.checkpoint region, with the region's number.
CHECKPOINT_REGION = "memplan_checkpoint_region"
# The qualified names of torch.utils.checkpoint's (non-reentrant) saved-tensor hooks begin
# so: they are the innermost hooks while a checkpointed function runs.
_CHECKPOINT_HOOKS = "_checkpoint_hook."


class _CheckpointRegions(TorchFunctionMode):
    """Marks each op traced inside a torch.utils.checkpoint region with the region's number
    (CHECKPOINT_REGION). Under torch.compile, Dynamo tags those regions itself; AOTAutograd
    traces the module directly and tags nothing, so without this mark the model's own
    checkpointing would be invisible to memplan.optimize (planner/lower.py reads both)."""

    def __init__(self) -> None:
        super().__init__()
        # Each region's pack hook, kept so that no later hook reuses its id: its number.
        self.regions: dict[Callable[..., Any], int] = {}

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: Any,
        args: Sequence[Any] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        hooks = compat.saved_tensors_hooks()
        pack = None if hooks is None else hooks[0]
        if pack is None or not getattr(pack, "__qualname__", "").startswith(_CHECKPOINT_HOOKS):
            return func(*args, **(kwargs or {}))
        region = self.regions.setdefault(pack, len(self.regions))
        with fx_traceback.annotate({CHECKPOINT_REGION: region}):
            return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def _exported(
    model: nn.Module, example_inputs: Sequence[Any], decompositions: Decompositions | None = None
) -> Iterator[Any]:
    with contextlib.ExitStack() as stack:
        try:
            # A trace for a compile, as torch.compile's: where a library takes another path
            # under torch.compiler.is_compiling() (transformers' mixture of experts, whose
            # grouped matrix product traces only in bfloat16), it takes it here too.
            with (
                fx_traceback.preserve_node_meta(),
                _CheckpointRegions(),
                compat.compiling_for_torch_compile(),
            ):
                # The step's writes into its inputs (BatchNorm's running statistics) stay
                # in the graph, as memplan's torch.compile backend has them (compile/backend.py),
                # so that both plan one graph.
                joint = compat.joint_exporter()(
                    stack,
                    model,
                    tuple(example_inputs),
                    decompositions=decompositions,
                    keep_inference_input_mutations=True,
                )
        except UnsupportedModel:
            raise
        except Exception as error:  # torch raises many types; name what failed
            raise UnsupportedModel(
                type(model).__name__, f"{type(error).__name__}: {first_line(error)}"
            ) from error
        yield joint


def module_copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A graph module with a graph of its own (the nodes' meta shared, not copied)."""
    graph = fx.Graph()
    copied, output = graph.graph_copy(gm.graph, {}, return_output_node=True)  # type: ignore[misc]
    graph.output(copied).meta = dict(output.meta)
    return fx.GraphModule(gm, graph)


def boxed_runner(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[[list[Any]], Any]:
    """Run `gm` as Python code in AOTAutograd's boxed calling convention.

    The generated code takes its inputs as a list it clears, and drops each value right
    after its last use (or at once, if nothing reads it), so that a tensor dies where the
    schedule frees it; holding inputs until the graph returns would keep saved activations
    alive through the whole backward. Generated code, unlike fx's Interpreter, adds no
    per-node Python dispatch to the step time.
    """
    keep_saved_tensors()  # this code reuses no input's buffer
    # fx's boxed code generator is what AOTAutograd's own compilers use for this.
    gm.graph.set_codegen(fx.graph._BoxedCodeGen())
    gm.recompile()

    def run(args: list[Any]) -> Any:
        return gm(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def keep_saved_tensors() -> None:
    """Have AOTAutograd's backward reuse no saved tensor's buffer in place (a donated
    buffer), so that `backward(retain_graph=True)` may run it again. torch.compile lowers
    the backward at its first call and drops that reuse where the call retains the graph;
    a backward lowered before any call (memplan's, for its check) cannot know, and that
    reuse makes a retaining call raise. Called from a compiler AOTAutograd calls: the list
    of such buffers is shared by the step's metadata and its inner graphs', so it is
    cleared in place."""
    metadata = compat.backward_metadata()
    if metadata is not None and metadata.bw_donated_idxs:
        metadata.bw_donated_idxs.clear()


def compile_training_step(
    model: nn.Module,
    example_inputs: Sequence[Any],
    partition_fn: PartitionFn,
    decompositions: Decompositions | None = None,
) -> Compiled:
    """Trace model(*example_inputs) with its backward and compile it through `partition_fn`,
    decomposing ops with `decompositions` where given (AOTAutograd's defaults otherwise).

    Nothing runs on real data: tracing uses fake tensors, so buffers are not updated.
    """
    if not model.training:
        raise UnsupportedModel(type(model).__name__, "model is in eval mode; call .train()")
    with _exported(model, example_inputs, decompositions) as joint:
        fn = compat.joint_compiler()(
            joint, partition_fn=partition_fn, fw_compiler=boxed_runner, bw_compiler=boxed_runner
        )
        return Compiled(
            fn=fn,
            param_names=list(joint.params_spec),
            buffer_names=list(joint.buffers_spec),
        )
