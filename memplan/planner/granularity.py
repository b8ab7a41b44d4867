"""What a device's allocator hands out for a request: the bytes a storage really holds.

PyTorch's CUDA caching allocator rounds every request up to a multiple of 512 bytes
(its smallest block), and `max_memory_allocated` counts the rounded blocks. A graph of
many small tensors (biases, norms' statistics) then peaks a few KiB above the sum of
their sizes, which is enough to break a budget set at the unplanned peak. The CPU
allocator's profiler events report the sizes asked for, so CPU sizes are kept as they
are.
"""

from __future__ import annotations

import torch

CUDA_BLOCK_BYTES = 512


def allocated_bytes(nbytes: int, device: torch.device) -> int:
    """The bytes `device`'s allocator holds for a storage of `nbytes` (0 stays 0)."""
    if device.type != "cuda" or nbytes <= 0:
        return nbytes
    return -(-nbytes // CUDA_BLOCK_BYTES) * CUDA_BLOCK_BYTES
