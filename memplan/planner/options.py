"""PlanOptions: how to plan a model (solver, profiling, offload, layout), one frozen
dataclass whose fields are the API's keyword options and the CLI's flags. No torch here,
so that the CLI reads its defaults without loading torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from memplan.core.devices import DeviceSpec
from memplan.core.errors import MemplanError, UnknownOption
from memplan.planner.layout import METHODS
from memplan.solvers import SolverOptions, check_known

# Host link bandwidth assumed when offloading and none is given: PCIe 4.0 x16 in practice.
DEFAULT_BANDWIDTH = {"cuda": 2.5e10, "cpu": 1.0e10}
FRAGMENTATION = ("live", "arena")
# Where a convolution's input of another layout is made contiguous: "kernel", inside the
# kernel (as traced); "graph", as a node of the graph (passes/contiguous.py); "choose",
# plan both and keep the faster plan within the budget.
CONVOLUTION_COPIES = ("choose", "kernel", "graph")
# Below this size an offload costs more in launch and bookkeeping than it saves.
DEFAULT_OFFLOAD_THRESHOLD = 64 * 1024


@dataclass(frozen=True)
class PlanOptions:
    """How to plan: the solver and its options, profiling, and whether to offload."""

    solver: str = "greedy"
    seed: int = 0
    time_limit: float = 60.0
    offload: bool | None = None  # None: offload where the device is not the host
    bandwidth: float | None = None  # host link bytes/s; None: DEFAULT_BANDWIDTH
    offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD
    measure: bool = True  # profile by running each node; False: roofline estimate
    # The device the roofline estimates for (memplan/core/devices.py); None: the device the
    # step is traced on. A plan for a GPU one does not have traces on fake tensors here.
    device_spec: DeviceSpec | None = None
    convolution_copies: str = "choose"  # one of CONVOLUTION_COPIES
    progress: bool = True
    # When no schedule fits: plan for the smallest feasible peak with a warning (the
    # torch.compile default, where each graph of a graph break is planned on its own)
    # instead of raising InfeasibleBudget.
    best_effort: bool = False
    # What the budget bounds: "live", the sum of live bytes (what the simulator counts);
    # "arena", the arena of the plan's layout, fragmentation included (planner/layout.py).
    fragmentation: str = "live"
    layout: str = "best"  # the layout method, one of layout.METHODS
    # Price the pointwise ops and views Inductor fuses away at 0 s (planner/fusion.py):
    # for graphs Inductor compiles, which the backend sets it for.
    fused_pointwise: bool = False

    def __post_init__(self) -> None:
        if self.fragmentation not in FRAGMENTATION:
            raise MemplanError(
                f"fragmentation must be one of {', '.join(FRAGMENTATION)}, "
                f"got {self.fragmentation!r}"
            )
        if self.convolution_copies not in CONVOLUTION_COPIES:
            raise MemplanError(
                f"convolution_copies must be one of {', '.join(CONVOLUTION_COPIES)}, "
                f"got {self.convolution_copies!r}"
            )
        if self.layout not in METHODS:
            raise MemplanError(f"layout must be one of {', '.join(METHODS)}, got {self.layout!r}")
        check_known(self.solver)
        # The solver's own checks (a positive time limit and bandwidth), made here so that
        # a bad value is refused where it is given: memplan.backend(...) builds these
        # options, and a first solve raising it would reach the user inside Dynamo's
        # BackendCompilerFailed.
        SolverOptions(seed=self.seed, time_limit=self.time_limit, bandwidth=self.bandwidth)

    def solver_options(self, device_type: str) -> SolverOptions:
        """The solver's options on a device of `device_type` ("cpu", "cuda")."""
        offload = self.offload if self.offload is not None else device_type != "cpu"
        bandwidth = None
        if offload:
            bandwidth = self.bandwidth or DEFAULT_BANDWIDTH.get(device_type, 1.0e10)
        return SolverOptions(seed=self.seed, time_limit=self.time_limit, bandwidth=bandwidth)


def keyword_options(own: Sequence[str], **options: Any) -> PlanOptions:
    """The PlanOptions of keyword `options` given to an entry point whose own parameters
    are `own`; UnknownOption, in one line naming every option it takes, for any other."""
    known = [field.name for field in fields(PlanOptions)]
    unknown = [repr(name) for name in options if name not in known]
    if unknown:
        noun = "option" if len(unknown) == 1 else "options"
        raise UnknownOption(
            f"unknown {noun} {', '.join(unknown)}; known: {', '.join([*own, *known])}"
        )
    return PlanOptions(**options)
