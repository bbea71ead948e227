"""Library chatter kept off stdout (it carries the one JSON document with --json) and known noise off stderr: used by
the ONNX export and by the hf runtime (golden checks)."""

from __future__ import annotations

import contextlib
import logging
import sys
import warnings
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Keep library chatter off stdout (one JSON document there with --json) and known noise off stderr."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo", "")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings(), contextlib.redirect_stdout(sys.stderr):
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            with transformers_quiet():
                yield
        finally:
            for lg, level in zip(loggers, levels, strict=True):
                lg.setLevel(level)


@contextlib.contextmanager
def transformers_quiet() -> Iterator[None]:
    """Silence transformers' progress bars and warnings for the duration, then restore them."""
    import importlib

    tlog: Any = importlib.import_module("transformers.utils.logging")  # untyped functions: used as Any
    verbosity, bars = tlog.get_verbosity(), tlog.is_progress_bar_enabled()
    tlog.set_verbosity_error()
    tlog.disable_progress_bar()
    try:
        yield
    finally:
        tlog.set_verbosity(verbosity)
        if bars:
            tlog.enable_progress_bar()
