"""Small models with random weights for tests, the demo and benchmarks.

Each builder returns a module whose forward returns the training loss, and example inputs
for it. Transformers models come from configs (nothing is downloaded); dropout is off so
that planned and eager gradients can be compared exactly.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class Example:
    """A model that returns its loss, inputs for one training step, and the class of its
    repeated block (what torch.utils.checkpoint wraps when every block is checkpointed)."""

    name: str
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]
    block: type[nn.Module] | None = None

    def to(self, device: torch.device | str) -> Example:
        """This example on `device`: the model moved there, the inputs copied."""
        device = torch.device(device)
        inputs = tuple(x.to(device) for x in self.inputs)
        return Example(self.name, self.model.to(device), inputs, self.block)


class LossOf(nn.Module):
    """Wraps a transformers model called with keywords so that forward(*inputs) -> loss."""

    def __init__(self, model: nn.Module, input_names: tuple[str, ...]) -> None:
        super().__init__()
        self.model = model
        self.input_names = input_names

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.model(**dict(zip(self.input_names, inputs, strict=True))).loss


class MLP(nn.Module):
    def __init__(self, width: int = 128, depth: int = 8) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.GELU()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(self.head(self.body(x)), target)


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class CNN(nn.Module):
    def __init__(self, channels: int = 16, blocks: int = 3) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1, bias=False), nn.BatchNorm2d(channels), nn.ReLU()
        )
        self.blocks = nn.Sequential(*(ResidualBlock(channels) for _ in range(blocks)))
        self.head = nn.Linear(channels, 10)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        features = self.blocks(self.stem(x)).mean(dim=(2, 3))
        return nn.functional.cross_entropy(self.head(features), target)


def mlp(batch: int = 2048) -> Example:
    torch.manual_seed(0)
    x, target = torch.randn(batch, 128), torch.randint(0, 10, (batch,))
    return Example("mlp", MLP(), (x, target), block=nn.Linear)


def cnn(batch: int = 8, image: int = 32, channels: int = 16, blocks: int = 3) -> Example:
    torch.manual_seed(0)
    x, target = torch.randn(batch, 3, image, image), torch.randint(0, 10, (batch,))
    return Example("cnn", CNN(channels, blocks), (x, target), block=ResidualBlock)


def _transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    return transformers


def gpt2(batch: int = 8, seq: int = 128, layers: int = 4, width: int = 64) -> Example:
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.GPT2Config(
        vocab_size=512,
        n_positions=seq,
        n_embd=width,
        n_layer=layers,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,  # the special tokens must fit the small vocabulary
        eos_token_id=0,
    )
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    lm = tf.GPT2LMHeadModel(config)
    # Named, not left for transformers to pick with a logged warning: a logging call is a
    # graph break under torch.compile.
    lm.loss_type = "ForCausalLM"
    model = LossOf(lm, ("input_ids", "labels"))
    block = tf.models.gpt2.modeling_gpt2.GPT2Block
    return Example("gpt2", model, (ids, ids.clone()), block=block)


def bert(batch: int = 8, seq: int = 128, layers: int = 4, width: int = 64) -> Example:
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.BertConfig(
        vocab_size=512,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=4 * width,
        max_position_embeddings=seq,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    model = LossOf(tf.BertForMaskedLM(config), ("input_ids", "labels"))
    block = tf.models.bert.modeling_bert.BertLayer
    return Example("bert", model, (ids, ids.clone()), block=block)


def vit(batch: int = 16, image: int = 32, layers: int = 4, width: int = 64) -> Example:
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.ViTConfig(
        image_size=image,
        patch_size=4,
        hidden_size=width,
        num_hidden_layers=layers,
        num_attention_heads=4,
        intermediate_size=4 * width,
        num_labels=10,
        # Set up front: transformers sets it on the first call, which makes Dynamo recompile.
        problem_type="single_label_classification",
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    pixels, labels = torch.randn(batch, 3, image, image), torch.randint(0, 10, (batch,))
    model = LossOf(tf.ViTForImageClassification(config), ("pixel_values", "labels"))
    return Example("vit", model, (pixels, labels), block=tf.models.vit.modeling_vit.ViTLayer)


def resnet(batch: int = 16, depths: tuple[int, int, int] = (3, 2, 1)) -> Example:
    """A small ResNet of basic blocks: `depths` blocks in each of its three stages."""
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.ResNetConfig(
        embedding_size=8,
        hidden_sizes=[32, 48, 64],
        depths=list(depths),
        layer_type="basic",
        num_labels=10,
        problem_type="single_label_classification",  # as for vit
    )
    pixels, labels = torch.randn(batch, 3, 64, 64), torch.randint(0, 10, (batch,))
    model = LossOf(tf.ResNetForImageClassification(config), ("pixel_values", "labels"))
    block = tf.models.resnet.modeling_resnet.ResNetBasicLayer
    return Example("resnet", model, (pixels, labels), block=block)


def resnet50(batch: int = 4, image: int = 64, width: int = 64) -> Example:
    """ResNet-50's layout (bottleneck blocks, depths 3, 4, 6, 3) with its widths scaled by
    width / 64 (64 is the real network)."""
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.ResNetConfig(
        embedding_size=width,
        hidden_sizes=[4 * width, 8 * width, 16 * width, 32 * width],
        depths=[3, 4, 6, 3],
        layer_type="bottleneck",
        num_labels=10,
        problem_type="single_label_classification",  # as for vit
    )
    pixels, labels = torch.randn(batch, 3, image, image), torch.randint(0, 10, (batch,))
    model = LossOf(tf.ResNetForImageClassification(config), ("pixel_values", "labels"))
    block = tf.models.resnet.modeling_resnet.ResNetBottleNeckLayer
    return Example("resnet50", model, (pixels, labels), block=block)


def llama(batch: int = 8, seq: int = 128, layers: int = 4, width: int = 64) -> Example:
    """A LLaMA-style decoder: RMSNorm, rotary embeddings, SwiGLU, grouped-query attention."""
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.LlamaConfig(
        vocab_size=512,
        hidden_size=width,
        intermediate_size=(8 * width) // 3,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=seq,
        attention_dropout=0.0,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    ids = torch.randint(0, config.vocab_size, (batch, seq))
    lm = tf.LlamaForCausalLM(config)
    lm.loss_type = "ForCausalLM"  # as for gpt2
    model = LossOf(lm, ("input_ids", "labels"))
    block = tf.models.llama.modeling_llama.LlamaDecoderLayer
    return Example("llama", model, (ids, ids.clone()), block=block)


def convnext(batch: int = 8, image: int = 64, width: int = 16) -> Example:
    """A ConvNeXt (depthwise 7x7 convolutions, channels-last LayerNorm, inverted
    bottlenecks), its widths scaled by width / 96 (96 is ConvNeXt-T's)."""
    tf = _transformers()
    torch.manual_seed(0)
    config = tf.ConvNextConfig(
        hidden_sizes=[width, 2 * width, 4 * width, 8 * width],
        depths=[2, 2, 2, 2],
        num_labels=10,
        problem_type="single_label_classification",  # as for vit
    )
    pixels, labels = torch.randn(batch, 3, image, image), torch.randint(0, 10, (batch,))
    model = LossOf(tf.ConvNextForImageClassification(config), ("pixel_values", "labels"))
    block = tf.models.convnext.modeling_convnext.ConvNextLayer
    return Example("convnext", model, (pixels, labels), block=block)


ZOO: dict[str, Callable[..., Example]] = {
    "mlp": mlp,
    "cnn": cnn,
    "gpt2": gpt2,
    "bert": bert,
    "vit": vit,
    "resnet": resnet,
    "resnet50": resnet50,
    "llama": llama,
    "convnext": convnext,
}
