"""The runtime ops that offload, prefetch, wait and release emit, registered as custom operators.

`torch.ops.memplan.offload`, `prefetch`, `wait` and `release` are torch.library operators
with fake implementations and declared mutation, so that inductor, torch.export,
AOTAutograd's cache and FX serialization treat them as ordinary ops:
- `offload(tensor) -> host` copies a tensor to (pinned) host memory on a copy stream;
- `prefetch(host, device, after) -> landed` copies it back on that stream ahead of its use;
- `wait(landed, after) -> ()` makes the compute stream wait for the copy. It returns nothing
  and is declared to mutate `landed`: an op may not return an alias of its input, and the
  declared write orders every later read of `landed` after the wait, in inductor's
  scheduler as in the graph;
- `release(tensor, host) -> ()` stands where the plan frees an offloaded tensor's device
  copy: the compute stream waits there until the offload has read it (the simulator's stall
  at that free). It is declared to mutate `tensor`, so that its buffer lives until then.
  Without it Inductor hands the buffer to the next kernel of its size as soon as the
  offload call returns (`buf23 = reinterpret_tensor(buf20, ...); del buf20  # reuse`), a
  reuse in its own code that the caching allocator's record_stream cannot guard: on a GPU
  that kernel overwrote the tensor while the copy stream still read it, and GPT-2's least
  plan (59 offloads, H200) trained with gradients 1.9e-3 off eager's.

`after` is read by neither: it is every storage the planned backward has made and not yet
freed where the op stands, and reading them keeps the op after everything the plan runs
before it (each earlier node made one of them or feeds one: what it made is either still
live or read by a later node before the op). Without it, Inductor's reordering for peak
memory moves every prefetch and wait to the start of the backward, where nothing but the
host copy feeds them: its estimate counts the host copy the prefetch consumes as freed
memory, so the move looks free, but on a GPU it lands every offloaded tensor on the device
at once. With only the latest storage, it still ran a product the plan runs before a
prefetch after it, where the two were independent: the copy landed one product early.

Copies keep the tensor's strides, so that the backward reads the layout it was traced
with. Where the device is the host (CPU) the copies still run, so the numerics are
tested, and the host copy is marked so that memory measurement does not count it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils.weak import WeakIdKeyDictionary

from memplan.passes.host_memory import add_host_storage

# host tensor or prefetched tensor -> the event its copy recorded on the copy stream
_copy_done = WeakIdKeyDictionary()
_copy_streams: dict[torch.device, torch.cuda.Stream] = {}


def _copy_stream(device: torch.device) -> torch.cuda.Stream:
    if device not in _copy_streams:
        _copy_streams[device] = torch.cuda.Stream(device=device)
    return _copy_streams[device]


def _empty_like_on(tensor: torch.Tensor, device: torch.device, *, pinned: bool) -> torch.Tensor:
    """An uninitialised tensor of `tensor`'s sizes, strides and dtype on `device`."""
    return torch.empty_strided(
        tensor.size(), tensor.stride(), dtype=tensor.dtype, device=device, pin_memory=pinned
    )


@torch.library.custom_op("memplan::offload", mutates_args=())
def offload(tensor: torch.Tensor) -> torch.Tensor:
    """Start a device-to-host copy; returns the host tensor (valid once the copy is done)."""
    if tensor.device.type != "cuda":
        host = _empty_like_on(tensor, torch.device("cpu"), pinned=False).copy_(tensor)
        add_host_storage(host.untyped_storage())  # a host copy is not device memory
        return host
    stream = _copy_stream(tensor.device)
    host = _empty_like_on(tensor, torch.device("cpu"), pinned=True)
    stream.wait_stream(torch.cuda.current_stream(tensor.device))
    with torch.cuda.stream(stream):
        host.copy_(tensor.detach(), non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
    # The caching allocator must not hand this block out before the copy has read it.
    tensor.record_stream(stream)
    _copy_done[host] = done
    return host


@offload.register_fake
def _offload_fake(tensor: torch.Tensor) -> torch.Tensor:
    return _empty_like_on(tensor, torch.device("cpu"), pinned=False)


@torch.library.custom_op("memplan::prefetch", mutates_args=())
def prefetch(
    host: torch.Tensor, device: torch.device, after: Sequence[torch.Tensor]
) -> torch.Tensor:
    """Start a host-to-device copy on the copy stream; `wait` before using the result.
    `after` only orders the call (the module's docstring)."""
    if device.type != "cuda":
        return _empty_like_on(host, device, pinned=False).copy_(host)
    stream = _copy_stream(device)
    with torch.cuda.stream(stream):
        # Ordered after the offload: same stream, and the offload event for clarity.
        if host in _copy_done:
            stream.wait_event(_copy_done[host])
        landed = _empty_like_on(host, device, pinned=False)
        landed.copy_(host, non_blocking=True)
        done = torch.cuda.Event()
        done.record(stream)
    _copy_done[landed] = done
    return landed


@prefetch.register_fake
def _prefetch_fake(
    host: torch.Tensor, device: torch.device, after: Sequence[torch.Tensor]
) -> torch.Tensor:
    return _empty_like_on(host, device, pinned=False)


@torch.library.custom_op("memplan::wait", mutates_args=("landed",))
def wait(landed: torch.Tensor, after: Sequence[torch.Tensor]) -> None:
    """Make the current stream wait for the tensor's prefetch. `after` only orders the
    call (the module's docstring)."""
    done = _copy_done.pop(landed, None)
    if done is not None:
        current = torch.cuda.current_stream(landed.device)
        current.wait_event(done)
        # Allocated on the copy stream, now used (and freed) on the compute stream.
        landed.record_stream(current)


@wait.register_fake
def _wait_fake(landed: torch.Tensor, after: Sequence[torch.Tensor]) -> None:
    return None


@torch.library.custom_op("memplan::release", mutates_args=("tensor",))
def release(tensor: torch.Tensor, host: torch.Tensor) -> None:
    """Make the current stream wait until the offload of `tensor` into `host` has read it,
    so that what runs next may reuse its memory (the module's docstring)."""
    done = _copy_done.get(host)
    if done is not None:
        torch.cuda.current_stream(tensor.device).wait_event(done)


@release.register_fake
def _release_fake(tensor: torch.Tensor, host: torch.Tensor) -> None:
    return None


# The operators as graphs call them (what the rewrite emits and a serialized graph names).
OFFLOAD = torch.ops.memplan.offload.default
PREFETCH = torch.ops.memplan.prefetch.default
WAIT = torch.ops.memplan.wait.default
RELEASE = torch.ops.memplan.release.default
