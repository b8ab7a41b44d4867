"""Symbolic sizes: a graph Dynamo traced with dynamic shapes is planned on its hints.

A size of such a graph is a SymInt: an expression in the symbols Dynamo made for the
dynamic dimensions (s0, s1, ...), with a hint, the value it had in the traced example.
memplan plans on the hints; the rewrite keeps the expressions, so the planned graphs run
at any size. A plan's prediction holds at its hints; `ShapeSignature` names the concrete
sizes a call runs at, and `at` evaluates a size there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sympy
import torch

from memplan.core.errors import UnsupportedModel


def concrete(value: object) -> object:
    """A number for a symbol (its hint: the value traced); anything else as it is."""
    if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
        return value.node.hint
    return value


def hint(size: object) -> int:
    """The traced value of a size (a SymInt's hint); an int as it is."""
    found = concrete(size)
    if not isinstance(found, int):
        raise UnsupportedModel(str(size), "a symbolic size without a hint cannot be planned")
    return found


@dataclass(frozen=True)
class SizeSymbol:
    """Where a graph's call carries the value of one size symbol: argument `arg` is that
    size itself (`dim` None) or a tensor whose dimension `dim` it is."""

    symbol: sympy.Symbol
    arg: int
    dim: int | None


def size_symbols(example_inputs: Sequence[object]) -> tuple[SizeSymbol, ...]:
    """The size symbols of a graph's (fake) example inputs, each once, by name: where a
    call carries each. Empty for a graph traced with static shapes."""
    found: dict[sympy.Symbol, SizeSymbol] = {}
    for i, value in enumerate(example_inputs):
        if isinstance(value, torch.SymInt) and isinstance(value.node.expr, sympy.Symbol):
            found.setdefault(value.node.expr, SizeSymbol(value.node.expr, i, None))
        elif isinstance(value, torch.Tensor):
            for d, extent in enumerate(value.shape):
                if isinstance(extent, torch.SymInt) and isinstance(extent.node.expr, sympy.Symbol):
                    found.setdefault(extent.node.expr, SizeSymbol(extent.node.expr, i, d))
    return tuple(sorted(found.values(), key=lambda s: s.symbol.name))


# A call's sizes: (symbol name, value) per size symbol, in name order.
ShapeSignature = tuple[tuple[str, int], ...]


def signature_of(symbols: Sequence[SizeSymbol], args: Sequence[object]) -> ShapeSignature:
    """The sizes a call with `args` runs at (with the example inputs: the hints)."""
    return tuple((s.symbol.name, hint(_carried(s, args))) for s in symbols)


def _carried(symbol: SizeSymbol, args: Sequence[object]) -> object:
    value = args[symbol.arg]
    if isinstance(value, torch.Tensor) and symbol.dim is not None:
        return value.shape[symbol.dim]
    return value


def describe(signature: ShapeSignature) -> str:
    """'s0=8, s1=128'."""
    return ", ".join(f"{name}={value}" for name, value in signature)


def at(signature: ShapeSignature) -> Callable[[object], int]:
    """A `lower` size function: a size evaluated at `signature`'s values."""
    by_name = dict(signature)
    # Each expression once: a graph's nodes share a few (a transformer's, a few dozen over
    # a thousand sizes), and sympy's substitution is most of the time a new size takes
    # to evaluate a plan at (Partitioner.at_sizes, in the step that first runs at it).
    evaluated: dict[sympy.Expr, int] = {}

    def size(value: object) -> int:
        if not isinstance(value, torch.SymInt):
            return hint(value)
        expr = value.node.expr
        if expr not in evaluated:
            known = {s: by_name[s.name] for s in expr.free_symbols if s.name in by_name}
            # A size no call carries (an unbacked one): as traced.
            complete = len(known) == len(expr.free_symbols)
            evaluated[expr] = int(expr.xreplace(known)) if complete else hint(value)
        return evaluated[expr]

    return size
