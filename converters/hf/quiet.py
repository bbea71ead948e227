"""Known noise of torch and transformers kept off stderr while mreg drives them: used by the ONNX export and by the hf
runtime (golden checks).

Only those libraries' own settings are touched, each restored on the way out: the root logger and `sys.stdout` are the
host process's (the exporters print nothing with `verbose=False`; the CLI keeps its own stdout for the JSON document).
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Keep torch's and transformers' known noise off stderr for the duration."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo")]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings(), _root_guarded():
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
def _root_guarded() -> Iterator[None]:
    """Leave the root logger as the host has it: a library that logs through it while it has no handler
    (onnxruntime's quantizer calls `logging.warning`) would run `basicConfig` and leave a handler there. For the
    duration such a root logger has one that shows errors only (on stderr, as logging's last resort would)."""
    root = logging.getLogger()
    if root.handlers:  # the host's own: its records go where the host sends them
        yield
        return
    guard = logging.StreamHandler()
    guard.setLevel(logging.ERROR)
    root.addHandler(guard)
    try:
        yield
    finally:
        root.removeHandler(guard)


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
