"""benchmarks.llm_gpu, issue 72's GPU campaign, at its tiny size on the CPU: every method
trains as no_ac does, memplan's runs hold their budgets, the JSON has what the page needs,
and the page goes where it is told, never into the repository's docs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from benchmarks.llm_gpu import (
    MARKERS,
    OFFLOAD_SHARE,
    ORDER,
    PLOT,
    PREDICTED,
    RESULT,
    SIZES,
    TARGETS,
    MixedPrecisionAdamW,
    Task,
    batch_for,
    in_process,
    main,
)
from benchmarks.paths import DOCS

TINY = SIZES["tiny"]


def test_the_tiny_campaign(tmp_path: Path) -> None:
    """The tiny campaign, each method in this process and unfused (a quick run; one test,
    so that test workers do not each run it), its page into its own folder."""
    page = DOCS / "results.md"
    before = page.read_text() if page.exists() else None
    main(["--sizes", "tiny", "--inner", "eager", "--same-process", "--out", str(tmp_path)])
    assert (page.read_text() if page.exists() else None) == before
    saved = json.loads((tmp_path / RESULT).read_text())
    runs = {r["method"]: r for r in saved["runs"]}
    assert list(runs) == list(ORDER)
    assert not [r["error"] for r in runs.values() if "error" in r]

    # Every method trains the same weights on the same tokens, as no_ac does.
    reference = runs["no_ac"]["losses"]
    assert len(reference) == 2 + TINY.steps  # the first step, the peak's, the timed ones
    assert reference[-1] < reference[0]  # AdamW trains
    for r in runs.values():
        assert r["peak_bytes"] > 0 and r["tokens_per_s"] > 0 and r["compile_s"] > 0
        assert r["losses"] == pytest.approx(reference, rel=1e-5), r["method"]

    # memplan's runs hold their budgets, and predict their peaks.
    full_ac, at = runs["full_ac"], runs["memplan_at_full_ac"]
    assert runs["no_ac"]["peak_bytes"] > full_ac["peak_bytes"]  # checkpointing saves memory
    assert at["budget_bytes"] == full_ac["peak_bytes"]
    assert at["peak_bytes"] <= at["budget_bytes"]
    assert at["predicted_peak_bytes"] == pytest.approx(at["peak_bytes"], rel=PREDICTED)
    # Told the optimizer, memplan counts what the fit does: AdamW's moments, 8 bytes per
    # parameter, and in mixed precision the fp32 masters and their gradients, 8 more.
    per_parameter = 8 if TINY.dtype == "fp32" else 16
    assert at["outside_bytes"] == per_parameter * at["parameters"] > 0
    assert runs["memplan_offload"]["budget_bytes"] == int(OFFLOAD_SHARE * full_ac["peak_bytes"])
    # On the CPU the host copies of offloaded tensors are the same memory: no offload
    # figure here is a result, and none is asserted.
    fit = runs["fit_prediction"]
    assert fit["carried_out"] == "reused"  # the CPU's trace is the fit's
    assert fit["predicted_peak_bytes"] < fit["unplanned_peak_bytes"]
    assert fit["predicted_peak_bytes"] == pytest.approx(fit["peak_bytes"], rel=PREDICTED)
    assert fit["peak_bytes"] <= fit["budget_bytes"]

    # The JSON has what the page needs; the page and its plot are in the campaign's folder.
    assert saved["machine"]["device"] == "cpu"
    assert saved["size"]["batch"] == TINY.batch and saved["size"]["inner"] == "eager"
    assert list(saved["targets"]) == list(TARGETS)
    assert saved["targets"]["no run out of memory"] is True
    text = (tmp_path / "results.md").read_text()
    assert MARKERS[0] in text and MARKERS[1] in text
    assert all(method in text for method in ORDER)
    assert (tmp_path / PLOT).stat().st_size > 0


def test_a_method_runs_in_a_process_of_its_own(tmp_path: Path) -> None:
    """The machine's description from a process of its own, and a process stopped at its
    time limit (its log kept either way)."""
    task = Task("machine", "", TINY.seq, TINY.batch, TINY.dtype, TINY.steps, "eager")
    found = in_process(task, 120, tmp_path / "machine.log")
    assert found["device"] == "cpu" and "transformers" in found
    stopped = in_process(task, 0.1, tmp_path / "stopped.log")
    assert stopped["error"] == "stopped after 0 s"
    assert (tmp_path / "stopped.log").exists()


def test_mixed_precision_holds_what_the_fit_counts() -> None:
    """bf16 weights: fp32 masters, gradients and two moments, 16 bytes per parameter (the
    fit's count); the weights are the updated masters, rounded."""
    torch.manual_seed(0)
    model = nn.Linear(8, 4).to(torch.bfloat16)
    optimizer = MixedPrecisionAdamW(list(model.parameters()))
    model(torch.randn(3, 8, dtype=torch.bfloat16)).sum().backward()
    before = model.weight.detach().clone()
    optimizer.step()
    assert optimizer.outside == 16 * (8 * 4 + 4)
    held = sum(t.nbytes for t in optimizer.tensors() if t.dim())  # the step counters aside
    assert held == optimizer.outside
    assert model.weight.grad is None and not torch.equal(model.weight, before)
    assert torch.equal(model.weight, optimizer.masters[0].to(torch.bfloat16))


def test_the_gpu_batch_fills_the_device() -> None:
    """8 sequences of 4,096 tokens on an H100's 80 GiB, 15 on an H200's 140 (the eager
    step's estimate within 90% of each)."""
    gpu = SIZES["gpu"]
    assert (batch_for(81559 * 2**20, gpu), batch_for(143771 * 2**20, gpu)) == (8, 15)
