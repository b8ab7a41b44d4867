"""Device specs for the roofline (memplan/core/devices.py): the built-in GPUs by name, spec
files with one-line errors, and roofline times that follow the dtype's peak."""

from __future__ import annotations

import json

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from memplan.core import devices
from memplan.core.devices import DeviceSpecError, load_spec, target
from memplan.planner.roofline import roofline_seconds


def test_the_four_datasheet_targets_and_their_figures():
    assert sorted(devices.TARGETS) == ["a100", "h100", "h200", "l4"]
    h100, h200 = target("H100"), target("h200")
    assert (h100.bfloat16_flops, h100.float32_flops, h100.bandwidth) == (989.4e12, 67e12, 3.35e12)
    assert h200.bandwidth == 4.8e12 and h200.memory > h100.memory
    assert target("l4").bandwidth == 300e9
    assert target("a100").host_to_device == 32e9 < h100.host_to_device == 64e9


def test_an_unknown_name_is_one_line_naming_the_known_ones():
    with pytest.raises(DeviceSpecError, match=r"unknown device 'b200'; known: a100, h100") as e:
        target("b200")
    assert "\n" not in str(e.value)


def test_a_spec_file_round_trips_and_may_leave_out_the_launch_cost(tmp_path):
    spec = target("h100")
    record = {k: v for k, v in spec.__dict__.items() if k != "launch_overhead"}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(record))
    assert load_spec(path) == spec


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"bandwidth": 0}, "'bandwidth' must be a finite number above 0"),
        ({"memory": 1.5}, "'memory' must be a non-negative integer"),
        ({"tflops": 3}, "unknown field(s) tflops"),
        ({"name": None}, "'name' must be a string"),
    ],
)
def test_a_bad_spec_file_is_one_line(tmp_path, change, message):
    record = {**target("l4").__dict__, **change}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(record))
    with pytest.raises(DeviceSpecError) as error:
        load_spec(path)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_missing_field_and_a_missing_file(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"name": "x", "memory": 1}))
    with pytest.raises(DeviceSpecError, match="'float32_flops' is missing"):
        load_spec(path)
    with pytest.raises(DeviceSpecError, match="no such file"):
        load_spec(tmp_path / "absent.json")


def test_a_bfloat16_matmul_runs_at_the_bfloat16_peak():
    """On an H100 a large matmul is compute-bound: bf16 at 989 TFLOP/s, fp32 at 67."""
    spec = target("h100")
    times = {}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(4096, 4096, dtype=dtype)
        gm = make_fx(torch.mm, tracing_mode="fake")(a, a)
        (mm,) = [n for n in gm.graph.nodes if n.op == "call_function"]
        times[dtype] = roofline_seconds(mm, spec) - spec.launch_overhead
    flops = 2 * 4096**3
    assert times[torch.float32] == pytest.approx(flops / 67e12)
    assert times[torch.bfloat16] == pytest.approx(flops / 989.4e12)


def test_the_cpus_fused_attention_is_costed_by_its_arithmetic():
    """torch's FLOP counter has no formula for the CPU's fused attention: the roofline
    gives it the GPU flash attention's (4 b h s^2 d forward), so that a model traced on
    CPU for a GPU does not cost its attention as if it did no arithmetic."""
    spec = target("h100")
    q = torch.randn(1, 32, 4096, 128, dtype=torch.bfloat16)
    attention = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    gm = make_fx(lambda q: attention(q, q, q, 0.0, True)[0], tracing_mode="fake")(q)
    (node,) = [n for n in gm.graph.nodes if n.target is attention]
    flops = 4 * 32 * 4096**2 * 128
    assert roofline_seconds(node, spec) == pytest.approx(flops / 989.4e12 + spec.launch_overhead)
