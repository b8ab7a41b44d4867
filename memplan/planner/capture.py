"""Capture: the joint forward+backward graph of a module, through AOTAutograd.

The joint graph is functionalized, decomposed ATen with a FakeTensor `val` on every node.
memplan plans inside the partition function AOTAutograd calls on that graph, so the
graph it plans is exactly the graph that runs, for the Python API, the .pt2 path and
torch.compile alike.
"""

from __future__ import annotations

import contextlib
import io
import os
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
from torch import nn
from torch._functorch.aot_autograd import (
    aot_compile_joint_with_descriptors,
    aot_export_joint_with_descriptors,
)

from memplan.errors import ModelFileError, UnsupportedModel

_FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"  # read by torch.load on each call

# AOTAutograd's partition hook: (joint_module, joint_inputs, *, num_fwd_outputs, ...) -> (fw, bw)
PartitionFn = Callable[..., tuple[torch.fx.GraphModule, torch.fx.GraphModule]]
# An op -> its decomposition table, as AOTAutograd takes it.
Decompositions = dict[torch._ops.OpOverload, Callable[..., Any]]


@dataclass
class Compiled:
    """A module's training step compiled with a given partition function."""

    fn: Callable[..., Any]  # takes (*params, *buffers, *inputs)
    param_names: list[str]
    buffer_names: list[str]


@contextlib.contextmanager
def _exported(
    model: nn.Module, example_inputs: Sequence[Any], decompositions: Decompositions | None = None
) -> Iterator[Any]:
    with contextlib.ExitStack() as stack:
        try:
            joint = aot_export_joint_with_descriptors(
                stack, model, tuple(example_inputs), decompositions=decompositions
            )
        except UnsupportedModel:
            raise
        except Exception as error:  # torch raises many types; name what failed
            raise UnsupportedModel(type(model).__name__, _first_line(error)) from error
        yield joint


def boxed_runner(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[[list[Any]], Any]:
    """Run `gm` as Python code in AOTAutograd's boxed calling convention.

    The generated code takes its inputs as a list it clears, and drops each value right
    after its last use (or at once, if nothing reads it), so that a tensor dies where the
    schedule frees it; holding inputs until the graph returns would keep saved activations
    alive through the whole backward. Generated code, unlike fx's Interpreter, adds no
    per-node Python dispatch to the step time.
    """
    # fx's boxed code generator is what AOTAutograd's own compilers use for this.
    gm.graph.set_codegen(fx.graph._BoxedCodeGen())
    gm.recompile()

    def run(args: list[Any]) -> Any:
        return gm(args)

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


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
        fn = aot_compile_joint_with_descriptors(
            joint, partition_fn=partition_fn, fw_compiler=boxed_runner, bw_compiler=boxed_runner
        )
        return Compiled(
            fn=fn,
            param_names=list(joint.params_spec),
            buffer_names=list(joint.buffers_spec),
        )


def load_exported(path: str | Path) -> torch.export.ExportedProgram:
    """Load a torch.export .pt2 program; a clear ModelFileError if it is missing or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file")
    data = path.read_bytes()
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise ModelFileError(f"{path}: not a torch.export .pt2 archive (not a zip file)")
    try:
        # torch.export.load unpickles with weights_only=False where an archive's config says
        # so, and retries sample inputs that way; forcing weights_only keeps a crafted .pt2
        # from running code.
        with _weights_only_loads():
            return torch.export.load(io.BytesIO(data))
    except Exception as error:  # any failure inside the archive means a corrupt file
        raise ModelFileError(
            f"{path}: cannot load the exported program: {_first_line(error)}"
        ) from error


def exported_module(program: torch.export.ExportedProgram) -> tuple[nn.Module, tuple[Any, ...]]:
    """The trainable module of an exported program and the example inputs it was saved with."""
    if program.example_inputs is None:
        raise ModelFileError("the .pt2 file carries no example inputs; export with args")
    args, kwargs = program.example_inputs
    if kwargs:
        raise ModelFileError("the .pt2 program takes keyword inputs; export with positional args")
    module = program.module()
    # ExportedProgram.module() overrides .train()/.eval() to raise NotImplementedError: how
    # dropout and batch norm behave is fixed in the graph at export time. nn.Module.train
    # still sets the flag compile_training_step checks.
    nn.Module.train(module, True)
    return module, tuple(args)


@contextlib.contextmanager
def _weights_only_loads() -> Iterator[None]:
    """Make every torch.load inside use weights_only=True, whatever its caller passes."""
    previous = os.environ.get(_FORCE_WEIGHTS_ONLY)
    os.environ[_FORCE_WEIGHTS_ONLY] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[_FORCE_WEIGHTS_ONLY]
        else:
            os.environ[_FORCE_WEIGHTS_ONLY] = previous


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"
