"""The format table: every converter mreg knows, by the module that holds it, imported on first use.

This is the only place the registry names a converter. A new format is a package under
`converters/` exposing `CONVERTER` (see `registry.convert.protocol.Converter`) and one row here.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from registry.errors import UsageError

if TYPE_CHECKING:  # the protocol imports manifests (pydantic); `mreg --help` reads only this table
    from registry.convert.protocol import Converter


@dataclass(frozen=True)
class FormatEntry:
    """One row: where the converter lives, and what the CLI must know without importing it."""

    module: str
    #: Order in which `mreg check` picks an artifact when no --format is given (None: no runtime).
    check_rank: int | None = None


FORMATS: dict[str, FormatEntry] = {
    "hf": FormatEntry("converters.hf.converter", check_rank=2),
    "gguf": FormatEntry("converters.gguf.converter", check_rank=0),
    "onnx": FormatEntry("converters.onnx.converter", check_rank=1),
    "tensorrt": FormatEntry("converters.tensorrt.converter"),
}


def get(fmt: str) -> Converter:
    """The converter for a format, imported on first use."""
    entry = FORMATS.get(fmt)
    if entry is None:
        raise UsageError(
            f"no converter for format {fmt!r}",
            hint=f"formats available in this install: {', '.join(available())}",
        )
    converter: Converter = importlib.import_module(entry.module).CONVERTER
    return converter


def known(fmt: str) -> bool:
    """Whether a format has a converter in this install."""
    return fmt in FORMATS


def available() -> list[str]:
    """Formats with a converter."""
    return sorted(FORMATS)


def runnable() -> list[str]:
    """Formats whose artifacts a golden check can run, in the order `mreg check` prefers them."""
    ranked = [(e.check_rank, f) for f, e in FORMATS.items() if e.check_rank is not None]
    return [f for _, f in sorted(ranked)]
