"""The runtime ops that offload, prefetch and wait emit: copies on a side stream.

On a GPU, `offload` copies a tensor to pinned host memory on a copy stream, `prefetch`
copies it back on that stream ahead of its use, and `wait` makes the compute stream wait
for it. Where the device is the host (CPU) the copies still run, so the numerics are
tested, and the host copy is marked so that memory measurement does not count it.
"""

from __future__ import annotations

import torch
from torch.utils.weak import WeakIdKeyDictionary

from memplan.passes.host_memory import host_allocations

# host tensor or prefetched tensor -> the event its copy recorded on the copy stream
_copy_done = WeakIdKeyDictionary()
_copy_streams: dict[torch.device, torch.cuda.Stream] = {}


def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _copy_streams:
        _copy_streams[device] = torch.cuda.Stream(device=device)
    return _copy_streams[device]


def offload(tensor: torch.Tensor) -> torch.Tensor:
    """Start a device-to-host copy; returns the host tensor (valid once the copy is done)."""
    if tensor.device.type != "cuda":
        with host_allocations():  # a host copy is not device memory, even on CPU
            return tensor.detach().clone()
    stream = _copy_stream(tensor.device)
    host = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
    stream.wait_stream(torch.cuda.current_stream(tensor.device))
    with torch.cuda.stream(stream):
        host.copy_(tensor.detach(), non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
    # The caching allocator must not hand this block out before the copy has read it.
    tensor.record_stream(stream)
    _copy_done[host] = done
    return host


def prefetch(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Start a host-to-device copy on the copy stream; `wait` before using the result."""
    if device.type != "cuda":
        return host.clone()
    stream = _copy_stream(device)
    with torch.cuda.stream(stream):
        # Ordered after the offload: same stream, and the offload event for clarity.
        if host in _copy_done:
            stream.wait_event(_copy_done[host])
        landed = host.to(device, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
    _copy_done[landed] = done
    return landed


def wait(tensor: torch.Tensor) -> torch.Tensor:
    """Make the current stream wait for the tensor's prefetch; returns the same tensor."""
    done = _copy_done.pop(tensor, None)
    if done is not None:
        current = torch.cuda.current_stream(tensor.device)
        current.wait_event(done)
        # Allocated on the copy stream, now used (and freed) on the compute stream.
        tensor.record_stream(current)
    return tensor
