"""Which ATen ops are views: ops whose output is their input's storage reinterpreted, which
read, write and allocate nothing, under eager and under Inductor alike.

One answer for every estimate that asks (the roofline's bytes moved, the transient bounds,
what Inductor fuses away), so that they cannot disagree about an op.
"""

from __future__ import annotations

import torch

from memplan import compat

# Views that do not say so (`is_view` false: autograd does not track them as views) but
# alias their input all the same; Inductor lowers them as views.
VIEWS_NOT_MARKED = frozenset({torch.ops.aten._unsafe_view.default})


def is_view(target: object) -> bool:
    """Whether an fx node's `target` is an ATen view."""
    if not compat.is_op_overload(target):
        return False
    return target.is_view or target in VIEWS_NOT_MARKED
