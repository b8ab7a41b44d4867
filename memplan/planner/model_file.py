"""Loading a saved model for `memplan plan`: a torch.export program (.pt2) without
unpickling code, or, only when asked, a pickled {"model": module, "inputs": tuple}.

Every failure is one ModelFileError naming the file and the cause.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memplan.core.errors import MemplanError, ModelFileError, first_line, one_line

# torch.save files; loading one unpickles, which can run any code the file's author chose.
PICKLE_SUFFIXES = frozenset({".pt", ".pth", ".pkl", ".pickle"})
_FORCE_WEIGHTS_ONLY = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"  # read by torch.load on each call
# Loggers that torch.export.load writes tracebacks to, as warnings, before it raises on a
# corrupt archive; the one-line error says the same.
_EXPORT_LOGGERS = ("torch.export", "torch._export")


def load_model(path: Path, *, allow_pickle: bool = False) -> tuple[nn.Module, tuple[Any, ...]]:
    """The trainable module in a .pt2 program and its example inputs, or, with
    `allow_pickle`, those of a pickled {"model": module, "inputs": tuple} dict.
    ModelFileError for any file they cannot be loaded from."""
    if path.suffix.lower() not in PICKLE_SUFFIXES:
        with _quiet_export_logs() as warnings:
            try:
                return exported_module(load_exported(path))
            except Exception as error:  # a corrupt archive can fail anywhere in torch
                # torch.export.load logs what went wrong, then raises "see the warnings above"
                logged = [r.exc_info[1] for r in warnings if r.exc_info and r.exc_info[1]]
                cause = logged[-1] if logged else error
                while logged and cause.__cause__ is not None:  # the root of what it logged
                    cause = cause.__cause__
                if isinstance(error, MemplanError) and not logged:
                    raise
                raise ModelFileError(
                    f"{path}: cannot load the exported program: "
                    f"{type(cause).__name__}: {first_line(cause)}"
                ) from error
    if not allow_pickle:
        raise ModelFileError(
            f"{path}: loading a pickled model runs arbitrary code from the file; "
            "pass --allow-pickle if you trust it, or save a torch.export program (.pt2)"
        )
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file")
    try:
        data = torch.load(path, weights_only=False)
    except Exception as error:  # unpickling raises anything the file's classes raise
        raise ModelFileError(f"{path}: cannot unpickle: {one_line(error)}") from error
    model = data.get("model") if isinstance(data, dict) else None
    inputs = data.get("inputs") if isinstance(data, dict) else None
    if not isinstance(model, nn.Module) or not isinstance(inputs, (tuple, list)):
        raise ModelFileError(
            f"{path}: expected a dict {{'model': nn.Module, 'inputs': tuple}}, "
            f"got {type(data).__name__}"
            + (f" with keys {sorted(map(str, data))}" if isinstance(data, dict) else "")
        )
    model.train()
    return model, tuple(inputs)


class _Collector(logging.Handler):
    """A log handler that keeps the records it is given."""

    def __init__(self, level: int) -> None:
        super().__init__(level)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def _quiet_export_logs() -> Iterator[list[logging.LogRecord]]:
    """Keep torch.export's warnings (tracebacks of what it could not deserialize) off
    stderr, collecting them instead: the ModelFileError that follows is the one line a
    user sees, and it names the error they carry."""
    collector = _Collector(logging.WARNING)
    loggers = [logging.getLogger(name) for name in _EXPORT_LOGGERS]
    saved = [(logger.handlers, logger.propagate) for logger in loggers]
    for logger in loggers:  # torch gives torch.export a stderr handler of its own
        logger.handlers = [collector]
        logger.propagate = False
    try:
        yield collector.records
    finally:
        for logger, (handlers, propagate) in zip(loggers, saved, strict=True):
            logger.handlers = handlers
            logger.propagate = propagate


def load_exported(path: str | Path) -> torch.export.ExportedProgram:
    """Load a torch.export .pt2 program; a clear ModelFileError if it is missing or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"{path}: no such file")
    data = path.read_bytes()
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise ModelFileError(f"{path}: not a torch.export .pt2 archive (not a zip file)")
    try:
        # torch.export.load unpickles with weights_only=False where an archive's config says
        # so, and retries sample inputs that way; forcing weights_only keeps a crafted .pt2
        # from running code.
        with _weights_only_loads():
            return torch.export.load(io.BytesIO(data))
    except Exception as error:  # any failure inside the archive means a corrupt file
        raise ModelFileError(
            f"{path}: cannot load the exported program: {type(error).__name__}: {first_line(error)}"
        ) from error


def exported_module(program: torch.export.ExportedProgram) -> tuple[nn.Module, tuple[Any, ...]]:
    """The trainable module of an exported program and the example inputs it was saved with."""
    if program.example_inputs is None:
        raise ModelFileError("the .pt2 file carries no example inputs; export with args")
    args, kwargs = program.example_inputs
    if kwargs:
        raise ModelFileError("the .pt2 program takes keyword inputs; export with positional args")
    module = program.module()
    # ExportedProgram.module() overrides .train()/.eval() to raise NotImplementedError: how
    # dropout and batch norm behave is fixed in the graph at export time. nn.Module.train
    # still sets the flag compile_training_step checks.
    nn.Module.train(module, True)
    return module, tuple(args)


@contextlib.contextmanager
def _weights_only_loads() -> Iterator[None]:
    """Make every torch.load inside use weights_only=True, whatever its caller passes."""
    previous = os.environ.get(_FORCE_WEIGHTS_ONLY)
    os.environ[_FORCE_WEIGHTS_ONLY] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[_FORCE_WEIGHTS_ONLY]
        else:
            os.environ[_FORCE_WEIGHTS_ONLY] = previous
