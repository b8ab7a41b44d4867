"""Models beyond the zoo: architectures users train that memplan was never tuned on.

The zoo (memplan/tools/zoo.py) is what the tests and most benchmarks use, and what
memplan's constants were ever checked against. These four are kept apart, so that a
benchmark over them (benchmarks/head_to_head.py) says how far memplan's figures carry to
models nobody tuned on. Nothing here may be used to choose a constant of memplan's.

- `lora_mistral`: a LoRA fine-tune (peft, rank 8 on the attention and MLP projections)
  of a Mistral-style decoder, its base weights frozen;
- `moe`: a Mixtral-style mixture-of-experts decoder (8 experts, 2 per token);
- `t5`: a T5 encoder-decoder (relative position biases, cross-attention);
- `swin`: a Swin transformer (windowed attention, patch merging).
Each is built from a config with random weights (nothing downloaded); dropout is off.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from memplan.tools.zoo import Example, LossOf


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    return transformers


class SquaredLogits(nn.Module):
    """A causal LM whose loss is the mean square of its logits, in float32: a loss that
    reads every logit, as a distillation's does."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=ids).logits.float().pow(2).mean()


def lora_mistral(batch: int = 4, seq: int = 192, layers: int = 4) -> Example:
    tf = _transformers()
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    config = tf.MistralConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=seq,
        sliding_window=None,
        attention_dropout=0.0,
    )
    base = tf.MistralForCausalLM(config)
    lora = LoraConfig(
        r=8,
        lora_alpha=16,
        lora_dropout=0.0,
        target_modules=[
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ],
    )
    model = SquaredLogits(get_peft_model(base, lora))
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    return Example("lora_mistral", model, (ids,))


def moe(batch: int = 4, seq: int = 128, layers: int = 4) -> Example:
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.MixtralConfig(
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=2,
        num_local_experts=8,
        num_experts_per_tok=2,
        max_position_embeddings=seq,
        sliding_window=None,
        attention_dropout=0.0,
    )
    lm = tf.MixtralForCausalLM(config)
    lm.loss_type = "ForCausalLM"  # named, as the zoo's are: a logged guess breaks graphs
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    return Example("moe", LossOf(lm, ("input_ids", "labels")), (ids, ids.clone()))


class Seq2Seq(nn.Module):
    """An encoder-decoder called with (source, target) that returns its loss."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=source, labels=target).loss


def t5(batch: int = 8, source: int = 128, target: int = 64, layers: int = 4) -> Example:
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.T5Config(
        vocab_size=4096,
        d_model=256,
        d_kv=32,
        d_ff=1024,
        num_layers=layers,
        num_decoder_layers=layers,
        num_heads=8,
        dropout_rate=0.0,
        decoder_start_token_id=0,
        pad_token_id=0,
    )
    model = Seq2Seq(tf.T5ForConditionalGeneration(config))
    inputs = (
        torch.randint(1, config.vocab_size, (batch, source)),
        torch.randint(1, config.vocab_size, (batch, target)),
    )
    return Example("t5", model, inputs)


def swin(batch: int = 16, image: int = 64) -> Example:
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.SwinConfig(
        image_size=image,
        patch_size=4,
        embed_dim=48,
        depths=[2, 2, 2],
        num_heads=[3, 6, 12],
        window_size=4,
        num_labels=10,
        problem_type="single_label_classification",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        drop_path_rate=0.0,
    )
    pixels, labels = torch.randn(batch, 3, image, image), torch.randint(0, 10, (batch,))
    model = LossOf(tf.SwinForImageClassification(config), ("pixel_values", "labels"))
    return Example("swin", model, (pixels, labels))


BEYOND: dict[str, Callable[..., Example]] = {
    "lora_mistral": lora_mistral,
    "moe": moe,
    "t5": t5,
    "swin": swin,
}
