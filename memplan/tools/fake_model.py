"""Models that allocate nothing: a transformers causal LM built from its config under
fake tensors, to plan real sizes (an 8B decoder at 4,096 tokens) on a machine that could
never hold them.

Fake tensors carry sizes, dtypes, strides and storage sharing exactly, and no data, so
the joint graph memplan traces from such a model and the bytes it plans are those of the
real model at those sizes; node times then come from a device's roofline
(`PlanOptions(measure=False, device_spec=...)`), since nothing can be run. The graph is
the one this machine's kernels would run: on a CPU-only build, attention is the CPU's
fused kernel, whose saved tensors match the GPU's flash attention in kind (the output and
its log-sum-exp), not always in layout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from memplan import compat
from memplan.core.errors import MemplanError, first_line
from memplan.core.training_state import DTYPE_NAMES
from memplan.tools.maxbatch import builder
from memplan.tools.zoo import Example, LossOf

# Names a user may give for the weights' and activations' dtype.
DTYPES = dict(zip(DTYPE_NAMES, (torch.float32, torch.bfloat16, torch.float16), strict=True))


class ConfigError(MemplanError, ValueError):
    """A config that cannot be read or built into a model, or settings it cannot take."""


def causal_lm(
    config_path: str | Path, *, batch: int, seq: int, dtype: str = "fp32", fake: bool = True
) -> Example:
    """The causal LM of a transformers config file (config.json), on fake tensors, whose
    forward returns the loss of next-token prediction on `batch` x `seq` token ids. Nothing
    is downloaded or allocated; ConfigError (one line) where it cannot be built. With
    `fake=False` the same model is built for real (random weights), to check a fake plan
    against the allocator where the model fits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if batch < 1 or seq < 1:
        raise ConfigError(f"batch and seq must be at least 1, got {batch} and {seq}")
    try:
        config = AutoConfig.from_pretrained(str(config_path), local_files_only=True)
    except Exception as error:  # transformers raises OSError, ValueError, KeyError
        raise ConfigError(f"{config_path}: cannot read the config: {first_line(error)}") from None
    longest = getattr(config, "max_position_embeddings", None) or getattr(
        config, "n_positions", None
    )
    if longest is not None and seq > longest:
        raise ConfigError(f"seq {seq} is longer than the config's {longest} positions")
    # use_cache stays as the config says: off, transformers reads the position ids'
    # values to look for packed sequences, which fake tensors cannot give; on, the cache
    # holds nothing the traced step keeps (the zoo's models train with it on too).
    with compat.fake_tensor_mode() if fake else contextlib.nullcontext():
        try:
            model = AutoModelForCausalLM.from_config(
                config, dtype=DTYPES[dtype], attn_implementation="sdpa"
            )
        except Exception as error:
            raise ConfigError(
                f"{config_path}: cannot build a causal LM from it: {first_line(error)}"
            ) from None
        ids = torch.randint(0, config.vocab_size, (batch, seq))
    model.train()
    # Named, not left for transformers to pick with a logged warning (as the zoo does).
    model.loss_type = "ForCausalLM"
    _no_dropout(model)
    name = f"{config.model_type} (fake)" if fake else config.model_type
    return Example(name, LossOf(model, ("input_ids", "labels")), (ids, ids))


def _no_dropout(model: nn.Module) -> None:
    """Dropout off: it draws random numbers the plan does not need, and training at these
    sizes is what is measured, not regularized."""
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0


def from_builder(spec: str) -> Callable[[int], Example]:
    """The model `spec` names (a memplan.tools.zoo model, or MODULE:FUNCTION taking
    batch=N, as `memplan maxbatch` takes them) for a batch size, built on fake tensors;
    ConfigError (one line) where it cannot be built so."""
    build = builder(spec)

    def fake(batch: int) -> Example:
        with compat.fake_tensor_mode():
            try:
                model, inputs = build(batch)
            except MemplanError:
                raise
            except Exception as error:  # the user's code, run on tensors without data
                raise ConfigError(
                    f"{spec}: cannot build it on fake tensors: {first_line(error)}"
                ) from None
        return Example(f"{spec} (fake)", model.train(), inputs)

    return fake
