"""The python blocks of the README and of docs/usage.md, run as written, in order, each
page in one namespace: its quick start trains and plans, and its plan is saved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from doc_blocks import ROOT, python_blocks


def test_the_readmes_quick_start_trains_and_plans_within_the_budget(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the quick start saves plan.json
    torch._dynamo.reset()
    namespace: dict[str, Any] = {}
    compiling, planning = python_blocks(ROOT / "README.md")
    compiling.run(namespace)
    assert namespace["model"]._compiled_call_impl is not None  # compiled in place
    assert torch.isfinite(namespace["loss"])
    planning.run(namespace)
    plan = namespace["planned"].plan
    assert plan.predicted_peak <= plan.budget < plan.unplanned_peak
    assert Path("plan.json").exists()


def test_the_usage_pages_blocks_run():
    torch._dynamo.reset()
    namespace: dict[str, Any] = {}
    for block in python_blocks(ROOT / "docs" / "usage.md"):
        block.run(namespace)
    assert namespace["model"]._compiled_call_impl is not None  # memplan.compile's
    assert namespace["compiled"]._orig_mod is namespace["model"]  # torch.compile's wrapper
