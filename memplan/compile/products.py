"""Matrix products kept where the plan runs them, against Inductor's addmm rewrite.

Among its post-grad passes, Inductor rewrites `add(mm(a, b), c)` into `addmm(c, a, b)`,
at the add's place. Where the product ran long before the add, that moves it, and holds
`a` and `b` until then. A tied weight's gradient is such a sum: the output layer's
product, made from the logits' gradient early in the backward, added to the embedding's
gradient at its end. Moved, the logits' gradient (2 MiB on the zoo's BERT) stays live
through the whole backward. The plan ran the product where its inputs were ready and
freed them: on BERT's least-memory plan, 7.36 MB planned compiled to 10.44 MB with the
rewrite and 8.20 MB without it (benchmarks.inductor_peaks); on GPT-2 of the head to head,
10.62 MB (two rounds) against 9.10 MB (one) (benchmarks.head_to_head; 2-core CPU,
2026-12-07).

`products_where_planned` undoes the moves: run after Inductor's own passes (the setting
`post_grad_custom_post_pass`), it splits each addmm that adds a full-sized tensor (not a
bias) and runs after some other op that computes since its later input: the product
right after that input, the add at the addmm's place. A bias's addmm (a linear layer's),
and a product added as soon as it is ready, are left whole.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import fx

from memplan import compat
from memplan.planner.views import is_view

# The Inductor setting the pass is given as (one pass; a user's own is left in its place).
SETTING = "post_grad_custom_post_pass"
_ADDMM = torch.ops.aten.addmm.default
_MM = torch.ops.aten.mm.default
_ADD = torch.ops.aten.add.Tensor


def products_where_planned(graph: fx.Graph) -> None:
    """Each addmm of `graph` that adds a full-sized tensor, split into its product run
    right after its later matrix input and the add at the addmm's place (the module's
    docstring)."""
    position = {node: i for i, node in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        if node.target is not _ADDMM or node.kwargs or len(node.args) != 3:
            continue
        added, first, second = node.args
        value = node.meta.get("val")
        if not _full_sized(added, value):
            continue
        later = max((first, second), key=lambda n: position[n])
        if later.op == "placeholder":  # both are inputs: at the body's start
            later = max(graph.find_nodes(op="placeholder"), key=lambda n: position[n])
        if not _moved(later, node):
            continue
        with graph.inserting_after(later):
            product = graph.call_function(_MM, (first, second))
        product.meta["val"] = _MM(first.meta["val"], second.meta["val"])
        with graph.inserting_before(node):
            total = graph.call_function(_ADD, (added, product))
        total.meta = dict(node.meta)
        node.replace_all_uses_with(total)
        graph.erase_node(node)


def products_pass() -> Any:
    """`products_where_planned` as the Inductor setting SETTING takes it."""
    return compat.post_grad_pass(products_where_planned, "memplan.products_where_planned")


def _moved(later: fx.Node, node: fx.Node) -> bool:
    """Whether an op that computes (no view) runs between a product's later input and
    the addmm: else the product ran there anyway, and the fused kernel is kept."""
    between = later.next
    while between is not node:
        if between.op == "call_function" and not is_view(between.target):
            return True
        between = between.next
    return False


def _full_sized(added: object, value: object) -> bool:
    """Whether an addmm adds a tensor of its own result's size (a sum of two products'
    worth, not a broadcast bias)."""
    if not isinstance(added, fx.Node) or not isinstance(value, torch.Tensor):
        return False
    given = added.meta.get("val")
    return isinstance(given, torch.Tensor) and given.shape == value.shape
