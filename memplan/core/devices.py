"""Devices as the roofline sees them: dense peak FLOP/s of matrix math per dtype, memory
bandwidth and size, and the host link each way, for planning on a GPU one does not have.

The built-in specs are the public datasheets' figures (dense, without structured
sparsity), named by `TARGETS`; a JSON file with the same fields describes any other
device (`load_spec`). float32 is plain FP32, not TF32: PyTorch runs float32 matmuls
without TF32 unless told to (`torch.backends.cuda.matmul.allow_tf32`). Memory is the
total the CUDA driver reports for the card, the most an allocator on it could ever hold.
Datasheet peaks are upper bounds: a roofline from them is a lower bound on node times,
and the docs report how far it is from measured times.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from pathlib import Path

from memplan.core import checks
from memplan.core.errors import MemplanError

GB = 10**9
TFLOPS = 10**12
MIB = 2**20


class DeviceSpecError(MemplanError, ValueError):
    """An unknown device name, or a device spec file that is unreadable or malformed."""


@dataclass(frozen=True)
class DeviceSpec:
    """One device's roofline: FLOP/s of matrix math by dtype, bytes/s to its memory and
    to and from the host, its memory in bytes, and the fixed cost of a kernel launch."""

    name: str
    memory: int
    float32_flops: float
    bfloat16_flops: float
    float16_flops: float
    bandwidth: float
    host_to_device: float
    device_to_host: float
    launch_overhead: float = 5e-6

    def matmul_flops(self, dtype: str) -> float:
        """Peak FLOP/s of matrix math on values of `dtype` (torch's name, "bfloat16");
        another dtype (float64, integers) gets the float32 figure."""
        return {"bfloat16": self.bfloat16_flops, "float16": self.float16_flops}.get(
            dtype, self.float32_flops
        )


# PCIe host links, bytes/s each way: Gen5 x16 and Gen4 x16.
_PCIE5, _PCIE4 = 64 * GB, 32 * GB

# Name -> spec, with the pattern a CUDA device's name matches to get it when measuring on
# that device is not possible (an op that cannot run alone there).
TARGETS: dict[str, tuple[str, DeviceSpec]] = {
    "h100": (
        r"\bH100\b",
        DeviceSpec("NVIDIA H100 SXM5 80GB", 81559 * MIB, 67 * TFLOPS, 989.4 * TFLOPS,
                   989.4 * TFLOPS, 3.35e12, _PCIE5, _PCIE5),
    ),
    "h200": (
        r"\bH200\b",
        DeviceSpec("NVIDIA H200 SXM 141GB", 143771 * MIB, 67 * TFLOPS, 989.4 * TFLOPS,
                   989.4 * TFLOPS, 4.8e12, _PCIE5, _PCIE5),
    ),
    "a100": (
        r"\bA100\b.*80GB",
        DeviceSpec("NVIDIA A100 SXM4 80GB", 81920 * MIB, 19.5 * TFLOPS, 312 * TFLOPS,
                   312 * TFLOPS, 2.039e12, _PCIE4, _PCIE4),
    ),
    "l4": (
        r"\bL4\b",
        DeviceSpec("NVIDIA L4 24GB", 23034 * MIB, 30.3 * TFLOPS, 121 * TFLOPS, 121 * TFLOPS,
                   300 * GB, _PCIE4, _PCIE4),
    ),
}  # fmt: skip

# A GPU of none of those names: a slow one's figures, so that estimates err long.
UNKNOWN_GPU = DeviceSpec("unknown GPU", 0, 10 * TFLOPS, 10 * TFLOPS, 10 * TFLOPS, 3e11,
                         16 * GB, 16 * GB)  # fmt: skip
# This process's CPU: no host link of its own (it is the host).
CPU = DeviceSpec("cpu", 0, 5e10, 5e10, 5e10, 1e10, math.inf, math.inf)


def target(name: str) -> DeviceSpec:
    """The built-in spec called `name` (case-insensitive); DeviceSpecError naming the
    known ones otherwise."""
    found = TARGETS.get(name.lower())
    if found is None:
        known = ", ".join(sorted(TARGETS))
        raise DeviceSpecError(
            f"unknown device {name!r}; known: {known} (or describe it in a spec file)"
        )
    return found[1]


def for_cuda_name(device_name: str) -> DeviceSpec:
    """The built-in spec whose pattern the CUDA device name matches, else UNKNOWN_GPU."""
    return next(
        (spec for pattern, spec in TARGETS.values() if re.search(pattern, device_name)),
        UNKNOWN_GPU,
    )


def load_spec(path: str | Path) -> DeviceSpec:
    """A DeviceSpec from a JSON object with DeviceSpec's fields (launch_overhead may be
    left out); DeviceSpecError with one line saying what is wrong."""
    raw = checks.read_json(path, DeviceSpecError, "a device spec")
    try:
        record = checks.obj(raw)
    except checks.Mismatch as mismatch:
        raise DeviceSpecError(f"{path}: a device spec {mismatch}") from None
    names = [f.name for f in fields(DeviceSpec)]
    unknown = sorted(set(record) - set(names))
    if unknown:
        raise DeviceSpecError(f"{path}: unknown field(s) {', '.join(unknown)}")

    def error(what: str) -> DeviceSpecError:
        return DeviceSpecError(f"{path}: {what}")

    # Each field's check; the others are rates. launch_overhead alone has a default.
    kinds: dict[str, checks.Check] = {
        "name": checks.text, "memory": checks.count, "launch_overhead": checks.seconds
    }  # fmt: skip
    values: dict[str, object] = {}
    for name in names:
        if name in record:
            values[name] = checks.field(record, name, kinds.get(name, _rate), error)
        elif name != "launch_overhead":
            raise error(f"{name!r} is missing")
    return DeviceSpec(**values)  # type: ignore[arg-type]


def _rate(value: object) -> float:
    """FLOP/s or bytes/s: a finite number above 0."""
    number = checks.seconds(value)
    if number == 0:
        raise checks.Mismatch("must be a finite number above 0, got 0")
    return number
