"""The examples of docs/trainers.md, run as written: memplan.compile in Hugging Face's
Trainer (its defaults), a plain PyTorch loop and accelerate, each trained as eager trains
the same model on the same data."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch
import transformers
import transformers.trainer
from doc_blocks import ROOT, Block, python_blocks

import memplan
import memplan.compile.module
from memplan.compile.backend import MemplanBackend
from memplan.core.budget import Budget
from memplan.core.errors import MemplanError, UnknownOption
from memplan.planner.allocator import Recording, recording
from memplan.planner.measure import resident_bytes

CPU = torch.device("cpu")
SETUP, TRAINER, LOOP, ACCELERATE = python_blocks(ROOT / "docs" / "trainers.md")
BUDGET = Budget.parse("3.75MiB").bytes  # the examples' budget
# Inductor's own tolerance for a step (compile_support._assert_same_grads).
TOLERANCE = {"rtol": 1e-4, "atol": 1e-5}


class StepPeak(transformers.TrainerCallback):
    """The allocator's peak of the Trainer's step `step` (0-based: forward, backward,
    clipping, the optimizer's step), whole: the parameters and optimizer state it starts
    with, and the most it allocates above them. The batch, made before the step begins,
    is not counted (2 KiB here)."""

    def __init__(self, step: int) -> None:
        self.step = step
        self.recorded = contextlib.ExitStack()
        self.recording: Recording | None = None
        self.resident = self.state = self.peak = 0

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        if state.global_step == self.step:
            moments = [t for s in optimizer.state.values() for t in s.values() if t.dim()]
            self.state = resident_bytes(moments, CPU)
            self.resident = resident_bytes([*model.parameters(), *moments], CPU)
            self.recording = self.recorded.enter_context(recording(CPU))

    def on_step_end(self, args, state, control, **kwargs):
        if self.recording is not None and state.global_step == self.step + 1:
            self.recorded.close()
            self.peak = self.resident + self.recording.peak_above_start()


def run(
    blocks: list[Block], monkeypatch: pytest.MonkeyPatch, *, compiled: bool
) -> tuple[dict[str, Any], list[MemplanBackend]]:
    """The namespace the blocks leave, run in a fresh folder with memplan.compile (or, not
    `compiled`, with it leaving the model as it is: eager), and the backends it made."""
    torch._dynamo.reset()
    backends: list[MemplanBackend] = []

    def made(*args: Any, **options: Any) -> MemplanBackend:
        backends.append(memplan.backend(*args, **options))
        return backends[-1]

    namespace: dict[str, Any] = {}
    with monkeypatch.context() as patch:
        if compiled:
            patch.setattr(memplan.compile.module, "backend", made)
        else:
            patch.setattr(memplan, "compile", lambda model, **options: model)
        for block in blocks:
            block.run(namespace)
    return namespace, backends


@pytest.fixture(autouse=True)
def _in_a_fresh_folder(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # the examples write under out/


def test_the_trainer_with_its_defaults_trains_as_eager_within_the_budget(monkeypatch):
    peaks: dict[bool, StepPeak] = {}
    defaults = transformers.trainer.DEFAULT_CALLBACKS

    def trained(compiled: bool) -> tuple[list[float], list[MemplanBackend]]:
        peaks[compiled] = StepPeak(2)  # the third, steady step: the first compiles
        callbacks = [*defaults, peaks[compiled]]  # every Trainer's, the examples' too
        monkeypatch.setattr(transformers.trainer, "DEFAULT_CALLBACKS", callbacks)
        with peaks[compiled].recorded:  # the recording ends, should the step fail in it
            namespace, backends = run([SETUP, TRAINER], monkeypatch, compiled=compiled)
        history = namespace["trainer"].state.log_history
        return [entry["loss"] for entry in history if "loss" in entry], backends

    eager, _ = trained(False)
    losses, backends = trained(True)
    assert len(losses) == 3 and backends and backends[0].plans
    torch.testing.assert_close(losses, eager, **TOLERANCE)
    # The budget counts AdamW's two moments, which the Trainer makes at its first step.
    assert backends[0].plans[-1].outside == peaks[True].state > 0
    assert peaks[True].peak <= BUDGET < peaks[False].peak


@pytest.mark.parametrize("example", [LOOP, ACCELERATE], ids=["plain loop", "accelerate"])
def test_a_loop_trains_as_eager(example: Block, monkeypatch):
    def trained(compiled: bool) -> tuple[list[float], list[MemplanBackend]]:
        namespace, backends = run([SETUP, example], monkeypatch, compiled=compiled)
        return namespace["losses"], backends

    eager, _ = trained(False)
    losses, backends = trained(True)
    assert len(losses) == 4 and backends and backends[0].plans
    torch.testing.assert_close(losses, eager, **TOLERANCE)
    # Told the optimizer, the budget counts its state: AdamW's two moments.
    parameters = sum(p.nbytes for p in backends[0].optimizer.param_groups[0]["params"])
    assert backends[0].plans[-1].outside == 2 * parameters


def test_the_compiled_model_keeps_its_forward_signature_attributes_and_state_dict_keys():
    torch._dynamo.reset()
    namespace: dict[str, Any] = {}
    SETUP.run(namespace)
    model, same = namespace["tiny_gpt2"](), namespace["tiny_gpt2"]()
    # torch.compile's wrapper hides them: what the Trainer reads, it would not find.
    wrapped = torch.compile(same, backend=memplan.backend(progress=False))
    assert "input_ids" not in inspect.signature(wrapped.forward).parameters
    assert all(key.startswith("_orig_mod.") for key in wrapped.state_dict())
    compiled = memplan.compile(model, budget="3.75MiB", progress=False)
    assert compiled is model and compiled.config.n_layer == 2
    assert inspect.signature(compiled.forward) == inspect.signature(same.forward)
    assert list(compiled.state_dict()) == list(same.state_dict())
    compiled.eval()
    assert not any(module.training for module in compiled.modules())


@pytest.mark.parametrize("entry", ["compile", "backend", "optimize"])
def test_an_unknown_option_is_refused_in_one_line_naming_the_known_ones(entry: str):
    model = torch.nn.Linear(4, 4)
    calls: dict[str, Callable[[], object]] = {
        "compile": lambda: memplan.compile(model, budget="50%", progess=False),
        "backend": lambda: memplan.backend(budget="50%", progess=False),
        "optimize": lambda: memplan.optimize(model, (torch.randn(2, 4),), progess=False),
    }
    with pytest.raises(UnknownOption) as raised:
        calls[entry]()
    message = str(raised.value)
    assert "\n" not in message and message.startswith("unknown option 'progess'; known: ")
    assert "progress" in message and "budget" in message
    assert isinstance(raised.value, TypeError)  # what Python raises for a keyword


def test_a_module_of_torch_nns_own_classes_is_refused_since_dynamo_would_skip_it():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(MemplanError) as raised:
        memplan.compile(model, budget="50%")
    assert "\n" not in str(raised.value) and "Sequential" in str(raised.value)
    assert model._compiled_call_impl is None  # nothing half-applied
