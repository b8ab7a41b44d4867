"""Sizes of a graph traced with dynamic shapes, evaluated at a call's sizes
(memplan.planner.shapes.at), as a plan is evaluated at a new size (Partitioner.at_sizes)."""

from __future__ import annotations

import torch
from torch._dynamo.source import ConstantSource
from torch.fx.experimental.symbolic_shapes import ShapeEnv

from memplan.planner.shapes import at, describe


def _size(env: ShapeEnv, traced: int, name: str) -> torch.SymInt:
    """A backed size symbol of `env`, traced at `traced`."""
    return env.create_symintnode(env.create_symbol(traced, ConstantSource(name)), hint=traced)


def test_a_size_is_evaluated_at_each_signature_and_a_plain_number_is_itself() -> None:
    env = ShapeEnv()
    batch, seq = _size(env, 8, "batch"), _size(env, 128, "seq")
    nbytes = batch * seq * 4  # a float32 activation's bytes, traced at 8 x 128
    names = str(batch.node.expr), str(seq.node.expr)
    smaller = ((names[0], 4), (names[1], 64))
    larger = ((names[0], 16), (names[1], 256))
    at_smaller, at_larger = at(smaller), at(larger)
    # Each expression is evaluated once per signature: asked again, the same value.
    assert [at_smaller(nbytes), at_smaller(nbytes), at_smaller(batch)] == [1024, 1024, 4]
    assert [at_larger(nbytes), at_larger(seq)] == [16384, 256]
    assert at_smaller(7) == 7 and nbytes.node.hint == 4096
    assert describe(smaller) == f"{names[0]}=4, {names[1]}=64"


def test_a_size_of_a_symbol_the_signature_does_not_carry_is_its_traced_value() -> None:
    env = ShapeEnv()
    batch, hidden = _size(env, 8, "batch"), _size(env, 32, "hidden")
    size = at(((str(batch.node.expr), 2),))
    assert size(batch * hidden) == 8 * 32 and size(batch) == 2
