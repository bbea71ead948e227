"""Converters: one small protocol, one module per format, heavy imports inside each.

A converter gets a verified source snapshot, its options and an empty artifact directory on
the store's filesystem; it writes the artifact tree there, verifies it against the source and
returns what it found. The registry knows nothing format-specific.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol

from manifests import Format, GGUFRequirements, SourceInfo, TensorRTRequirements, Verification
from registry.errors import MregError, UsageError
from registry.progress import Progress

#: Place a source file into the artifact tree (hard link from the cache or verified copy); returns its sha256.
PlaceFile = Callable[[Path, str, str], str]


@dataclass(frozen=True)
class ConversionRequest:
    """Everything a converter may use."""

    source: SourceInfo
    source_files: Callable[[str], Path]
    options: dict[str, Any]
    workdir: Path
    progress: Progress
    place: PlaceFile
    #: Artifact directories already in this version (carried from the parent or made earlier in this run).
    artifacts: dict[str, Path] = field(default_factory=dict)
    #: Their files' sha256 by format and path inside the artifact, as already recorded (no second hashing).
    artifact_digests: dict[str, dict[str, str]] = field(default_factory=dict)
    #: The model's name in the store (for file names that must stay the same across versions).
    name: str = ""
    #: A directory in the store where a converter may keep what speeds up rebuilds (never part of a version).
    cache_dir: Path | None = None

    def link_source(self, directory: Path) -> Path:
        """Lay the source out under `directory` as the repository has it (symlinks to the cache's blobs).

        The cache hands out blobs; transformers, tokenizer and config readers want the repository's layout.
        """
        for f in self.source.files:
            link = directory / f.path
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(self.source_files(f.path))
        return directory


@dataclass(frozen=True)
class ConversionResult:
    """What a converter produced: digests it already knows, its verification, what the artifact needs."""

    verification: Verification
    known_digests: dict[str, str] = field(default_factory=dict)
    requirements: TensorRTRequirements | GGUFRequirements | None = None
    tool_versions: dict[str, str] = field(default_factory=dict)


class Converter(Protocol):
    """A format converter."""

    format: ClassVar[Format]
    name: ClassVar[str]
    version: ClassVar[str]

    def options(self, raw: dict[str, Any]) -> dict[str, Any]:
        """Validate and normalize options; the result is part of the conversion key."""

    def tool_versions(self) -> dict[str, str]:
        """Versions of the tools whose output this converter's result depends on."""

    def convert(self, request: ConversionRequest) -> ConversionResult:
        """Write the artifact into `request.workdir` and verify it against the source."""

    # Optional: `convert_many(requests) -> list[ConversionResult]` makes several targets of the format
    # (same source, same workdir) in one pass; each result's known_digests names every file it wrote.


def spec_of(fmt: str, raw: dict[str, Any], hint: str) -> str:
    """The `SPEC` of `--to FMT:SPEC` ("" when absent); raw options are `{"spec": ...}` and nothing else."""
    extra = set(raw) - {"spec"}
    if extra:
        raise UsageError(f"--to {fmt} takes only a spec (got {', '.join(sorted(extra))})", hint=hint)
    return str(raw.get("spec") or "")


class StageFailed(MregError):
    """A converter's library failed in one stage (load, export, build, verification)."""

    def __init__(self, tool: str, stage: str, error: BaseException) -> None:
        first = (str(error).strip().splitlines() or [""])[0][:300]
        super().__init__(f"{tool} {stage} failed: {type(error).__name__}: {first}",
                         hint="MREG_DEBUG=1 shows the traceback; nothing was published")
        self.stage = stage


@contextlib.contextmanager
def stage(progress: Progress, tool: str, name: str) -> Iterator[None]:
    """Report a stage of a conversion; turn a library's exception into one line that names the stage."""
    progress.start(name, None, unit="step")
    try:
        yield
    except MregError:
        raise
    except Exception as e:
        raise StageFailed(tool, name, e) from e
    progress.done()


_MODULES: dict[str, str] = {"hf": "converters.hf", "gguf": "converters.gguf", "onnx": "converters.onnx",
                          "tensorrt": "converters.tensorrt"}


def get(fmt: str) -> Converter:
    """The converter for a format, imported on first use."""
    module = _MODULES.get(fmt)
    if module is None:
        raise UsageError(
            f"no converter for format {fmt!r}",
            hint=f"formats available in this install: {', '.join(sorted(_MODULES))}",
        )
    converter: Converter = importlib.import_module(module).CONVERTER
    return converter


def available() -> list[str]:
    """Formats with a converter."""
    return sorted(_MODULES)
