"""Made-up values for measuring kernels: floats tiled from a small seeded pool, zero
integers.

The profile and the compile path's workspace measurement both run kernels on values no
user gave. Both make them here, so that neither draws from torch's global generator
(measuring must not move the user's dropout masks) and neither pays a random draw per
float (940 million floats on a 1145-node graph took 9.3 s to draw).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# Floats in the pool values are tiled from (256 KiB of float32): random enough that no
# kernel meets a special case (zeros, a constant), small beside what a pass holds.
POOL_FLOATS = 1 << 16


def span(shape: Sequence[int], stride: Sequence[int]) -> int:
    """The elements of storage a tensor of this layout reaches from its offset."""
    return 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if all(shape) else 0


def float_pool(longest: int, device: torch.device) -> torch.Tensor:
    """Random float32s on `device`, as many as `longest` up to POOL_FLOATS (at least one),
    from a generator seeded for this pool alone."""
    count = max(1, min(POOL_FLOATS, longest))
    return torch.randn(count, generator=torch.Generator().manual_seed(0)).to(device)


def made_up(
    shape: Sequence[int],
    stride: Sequence[int],
    offset: int,
    dtype: torch.dtype,
    device: torch.device,
    floats: torch.Tensor,
) -> torch.Tensor:
    """A tensor of this layout, with a storage of exactly what it reaches: floats tiled
    from `floats`, zero integers (always a valid index)."""
    storage = torch.empty(offset + span(shape, stride), dtype=dtype, device=device)
    if dtype.is_floating_point or dtype.is_complex:
        tiled(storage, floats)
    else:
        storage.zero_()
    return storage.as_strided(shape, stride, offset)


def tiled(out: torch.Tensor, floats: torch.Tensor) -> torch.Tensor:
    """`out` (1-D) filled with `floats` repeated: one copy from the pool, then copies of
    what is filled already, doubling it, so a value of n floats takes log2(n / pool)
    copies."""
    filled = min(out.numel(), floats.numel())
    out[:filled].copy_(floats[:filled])
    while filled < out.numel():
        more = min(filled, out.numel() - filled)
        out[filled : filled + more].copy_(out[:more])
        filled += more
    return out
