"""Planning on fake tensors (memplan/tools/fake_model.py): a model built from its config
allocates nothing, and its plan is byte for byte the real model's, times estimated for a
target device's roofline."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import memplan
from memplan.core.devices import target
from memplan.core.errors import MemplanWarning
from memplan.tools.fake_model import ConfigError, causal_lm
from memplan.tools.zoo import Example, LossOf

GPT2 = {
    "model_type": "gpt2", "vocab_size": 512, "n_positions": 64, "n_embd": 64, "n_layer": 2,
    "n_head": 4, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
    "bos_token_id": 0, "eos_token_id": 0,
}  # fmt: skip


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT2))
    return path


def real_model(path, batch: int, seq: int) -> Example:
    """The same model built for real, by transformers alone (not fake_model's code), so
    that the fake model is checked against an independent construction."""
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").train()
    model.loss_type = "ForCausalLM"
    ids = torch.randint(0, cfg.vocab_size, (batch, seq))
    return Example("real", LossOf(model, ("input_ids", "labels")), (ids, ids))


def planned(example: Example, budget: str) -> memplan.Plan:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemplanWarning)  # roofline estimates
        return memplan.plan(
            example.model, example.inputs, budget, measure=False, device_spec=target("h100"),
            progress=False, best_effort=True,
        )  # fmt: skip


def test_the_fake_models_plan_is_the_real_models(config):
    fake = causal_lm(config, batch=4, seq=64)
    assert all(isinstance(p, torch._subclasses.FakeTensor) for p in fake.model.parameters())
    real = real_model(config, batch=4, seq=64)
    for budget in ("100%", "60%"):
        from_fake, from_real = planned(fake, budget), planned(real, budget)
        assert from_fake.predicted_peak == from_real.predicted_peak
        assert from_fake.decisions == from_real.decisions
        assert from_fake.predicted_time == pytest.approx(from_real.predicted_time)


def test_bf16_halves_the_weights(config):
    fp32, bf16 = (causal_lm(config, batch=2, seq=32, dtype=d) for d in ("fp32", "bf16"))
    sizes = [sum(p.nbytes for p in e.model.parameters()) for e in (fp32, bf16)]
    assert sizes[0] == 2 * sizes[1]
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"dtype": "int8"}, "dtype must be one of fp32, bf16, fp16, got 'int8'"),
        ({"seq": 65}, "seq 65 is longer than the config's 64 positions"),
        ({"batch": 0}, "batch and seq must be at least 1"),
    ],
)
def test_settings_the_model_cannot_take_are_one_line(config, settings, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        causal_lm(config, **{"batch": 2, "seq": 32, **settings})


def test_a_config_that_cannot_be_read_or_built_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config") as error:
        causal_lm(tmp_path / "absent.json", batch=1, seq=8)
    assert "\n" not in str(error.value)
    unknown = tmp_path / "config.json"
    unknown.write_text(json.dumps({"model_type": "no-such-model"}))
    with pytest.raises(ConfigError) as error:
        causal_lm(unknown, batch=1, seq=8)
    assert "\n" not in str(error.value)
