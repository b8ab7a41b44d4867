"""The step as Inductor emits it (core/emitted.py), simulated: hand-made wrappers whose
peaks are worked out in the comments. Pure: no torch."""

from __future__ import annotations

from memplan.core.emitted import Alias, Allocate, Emitted, Kernel, Release, step_graph
from memplan.core.graph import Node, NodeKind
from memplan.core.simulate import simulate

# The step's resident tensors: a 100-byte weight and a 10-byte input.
RESIDENT = {
    "w": Node(0, "w", "placeholder", bytes=100, kind=NodeKind.PARAM),
    "x": Node(1, "x", "placeholder", bytes=10, kind=NodeKind.INPUT),
}


def peak(forward: Emitted, backward: Emitted | None, workspace=None) -> tuple[int, int]:
    graph, schedule = step_graph(RESIDENT, forward, backward, workspace or {})
    trace = simulate(graph, schedule)
    return trace.peak, trace.live[schedule.split - 1]


def test_a_forward_alone_holds_its_buffers_until_released():
    # 110 resident; buf0 (40) and buf1 (30) live together: 180; buf0 released, then
    # the loss (4) made: 110 + 30 + 4 = 144 at the end, the loss kept for the caller
    forward = Emitted(
        inputs=(("w", 100), ("x", 10)),
        events=(
            Allocate("buf0", 40),
            Allocate("buf1", 30),
            Release("buf0"),
            Allocate("buf2", 4),
            Release("buf1"),
        ),
        returned=("loss",),
        outputs=("buf2",),
    )
    assert peak(forward, None) == (180, 114)


def test_a_reused_buffer_is_one_allocation():
    # buf1 takes dead buf0's storage: with the loss, 110 + 40 + 4, not 110 + 80 + 4
    forward = Emitted(
        inputs=(("w", 100), ("x", 10)),
        events=(
            Allocate("buf0", 40),
            Alias("buf1", "buf0"),
            Release("buf0"),
            Allocate("buf2", 4),
            Release("buf1"),
        ),
        returned=("loss",),
        outputs=("buf2",),
    )
    assert peak(forward, None)[0] == 154


def test_the_backward_frees_what_it_reads_of_the_forward_after_its_last_read():
    # forward: saves buf0 (40) as "h", returns the loss buf1 (4): 154 at its end.
    # backward: tangent (4) arrives: 158; grad of w (100) made: 258; h released: 218;
    # when it returns, the tangent is dropped: w and x, the loss and w's gradient stay
    forward = Emitted(
        inputs=(("w", 100), ("x", 10)),
        events=(Allocate("buf0", 40), Allocate("buf1", 4)),
        returned=("loss", "h"),
        outputs=("buf1", "buf0"),
    )
    backward = Emitted(
        inputs=(("h", 40), ("tangents_1", 4)),
        events=(Allocate("buf0", 100), Release("h")),
        returned=("grad_w",),
        outputs=("buf0",),
    )
    graph, schedule = step_graph(RESIDENT, forward, backward, {})
    trace = simulate(graph, schedule)
    assert trace.peak == 258
    assert trace.live[schedule.split - 1] == 154
    assert trace.live[-1] == 214


def test_a_view_of_a_saved_tensor_keeps_it_alive_until_both_are_released():
    # "h" and its view "hv" are one buffer (buf0, 40): released once both are
    forward = Emitted(
        inputs=(("w", 100), ("x", 10)),
        events=(Allocate("buf0", 40),),
        returned=("h", "hv"),
        outputs=("buf0", "buf0"),
    )
    backward = Emitted(
        inputs=(("h", 40), ("hv", 40), ("tangents_1", 0)),
        events=(Release("h"), Allocate("buf1", 50), Release("hv"), Allocate("buf2", 20)),
        returned=("grad_w",),
        outputs=("buf2",),
    )
    # 110 + 40 + 50 = 200 while buf1 is made, the view still holding buf0
    assert peak(forward, backward)[0] == 200


def test_an_extern_kernel_holds_its_workspace_while_it_runs():
    # buf0 (40) made by a convolution whose op holds 25 while it runs: 110 + 40 + 25
    forward = Emitted(
        inputs=(("w", 100), ("x", 10)),
        events=(
            Allocate("buf0", 40),
            Kernel(("convolution",)),
            Release("buf0"),
            Allocate("buf1", 4),
        ),
        returned=("loss",),
        outputs=("buf1",),
    )
    assert peak(forward, None, {"convolution": 25})[0] == 175


def test_a_recomputed_op_holds_its_forward_op_s_workspace():
    forward = Emitted((("w", 100), ("x", 10)), (Allocate("buf0", 4),), ("loss",), ("buf0",))
    backward = Emitted(
        inputs=(("tangents_1", 0),),
        events=(Allocate("buf0", 40), Kernel(("recompute_convolution",)), Allocate("buf1", 1)),
        returned=("grad_w",),
        outputs=("buf1",),
    )
    # 114 after the forward; 154 with the recomputed buffer; + 25 while the kernel runs
    assert peak(forward, backward, {"convolution": 25})[0] == 179


def test_the_strides_a_forward_returns_its_tensors_with_are_named():
    forward = Emitted(
        inputs=(("w", 100),),
        events=(Allocate("buf0", 40),),
        returned=("h", None),
        outputs=("buf0", None),
        strides=((1, 8), None),
    )
    assert forward.strides_by_name() == {"h": (1, 8)}
