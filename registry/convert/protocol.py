"""The converter protocol: what the registry asks of a format, and the helpers converters share.

A converter gets a verified source snapshot, its options and an empty artifact directory on
the store's filesystem; it writes the artifact tree there, verifies it against the source and
returns what it found. Everything format-specific the registry needs (the formats a target
needs first, gates, the file an engine opens, the runtime that runs the artifact for golden
checks) is asked through `Converter`; the registry knows nothing format-specific.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from manifests import Artifact, GGUFRequirements, Manifest, SourceInfo, TensorRTRequirements, Verification
from registry.errors import MregError, UsageError
from registry.progress import Progress

#: Place a source file into the artifact tree (hard link from the cache or verified copy); returns its sha256.
PlaceFile = Callable[[Path, str, str], str]


@dataclass(frozen=True)
class ConversionRequest:
    """Everything a converter may use."""

    source: SourceInfo
    source_files: Callable[[str], Path]
    options: Options
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
    #: The files the options name (an importance matrix, a calibration text), by the sha256 the options record.
    files: Mapping[str, Path] = field(default_factory=dict)
    #: The source's config.json, read once for every reader (None: it has none, or it is not a JSON object).
    config: dict[str, Any] | None = None

    @property
    def configs_read(self) -> dict[str, dict[str, Any]]:
        """The configs already read, by label, for `registry.convert.configs.check_configs` to skip."""
        return {"config.json": self.config} if self.config is not None else {}

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
    #: Bytes of the weights an engine loads (recorded as the artifact's `weights_bytes`); None: not known.
    weights_bytes: int | None = None


#: A converter's normalized options: JSON values, part of the conversion key and of the manifest.
Options = dict[str, Any]
#: What `--to FMT[:SPEC]` gives a converter to parse: `{"spec": SPEC}`, or nothing.
RawOptions = dict[str, str]
#: One requested target in its string form: a format and its raw options.
Target = tuple[str, RawOptions]


class TargetOptions(Protocol):
    """A converter's typed options for one target: a frozen dataclass its converter declares (`GGUFOptions`).

    The CLI builds them from `--to FMT:SPEC` (the converter's `parse`) and its typed flags; the API takes them
    as they are. Nothing is checked or read until the converter `prepare`s them, once per conversion.
    """

    format: ClassVar[str]


@dataclass(frozen=True)
class Prepared:
    """One target's options, checked and normalized once: what the key and the manifest record, and the files
    they name (read and hashed then), which travel beside the key to the converter, never inside it."""

    format: str
    #: JSON values: part of the conversion key and of the manifest (digests of the files, never their paths).
    options: Options
    #: The files the options name, by the sha256 `options` records.
    files: Mapping[str, Path] = field(default_factory=dict)


@dataclass(frozen=True)
class Generation:
    """Greedy continuation of a prompt."""

    text: str
    prompt_tokens: int
    output_tokens: int
    seconds: float


@dataclass(frozen=True)
class Embedding:
    """A pooled, normalized embedding of a text."""

    vector: tuple[float, ...]
    prompt_tokens: int
    seconds: float


class Session(Protocol):
    """A loaded artifact, for golden checks (greedy decoding, fixed seeds: runs are repeatable)."""

    @property
    def runtime(self) -> str:
        """The runtime's name (`llama.cpp`, `onnxruntime`, `transformers`)."""

    @property
    def runtime_version(self) -> str:
        """What ran the artifact, with versions, for the check record."""

    @property
    def kind(self) -> Literal["decoder", "encoder"]:
        """A generator or an embedder."""

    @property
    def context_length(self) -> int | None:
        """The longest prompt plus output the model takes, when known."""

    def count_tokens(self, text: str, templated: bool = False) -> int:
        """Tokens the model's own tokenizer makes of a text (with the special tokens it adds; `templated`: a
        rendered chat, which already holds them, tokenized as transformers does: none added, those in it parsed)."""

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """A chat (and the tools offered, if any) rendered with the model's own chat template, ready for generation."""

    def generate(self, prompt: str, max_new_tokens: int, templated: bool = False) -> Generation:
        """Greedy generation (`templated` as for count_tokens: a rendered chat gets no second BOS)."""

    def embed(self, text: str) -> Embedding:
        """Mean-pooled, L2-normalized embedding (encoders)."""

    def close(self) -> None:
        """Free the model."""


class Converter(Protocol):
    """A format converter: the one seam between the registry and a format."""

    format: ClassVar[str]
    name: ClassVar[str]
    version: ClassVar[str]
    #: Formats a version must carry before this one can be made (TensorRT builds from ONNX).
    needs: ClassVar[tuple[str, ...]]
    #: Whether `convert_many` makes several targets of this format in one pass over the source.
    converts_many: ClassVar[bool]

    def parse(self, raw: RawOptions) -> TargetOptions:
        """The string form (`--to FMT:SPEC`) as this converter's typed options; nothing is read yet."""

    def apply_flags(self, options: TargetOptions, fields: Mapping[str, Any]) -> TargetOptions:
        """`options` (parsed from `--to FMT:SPEC`) with the fields the CLI's typed flags set, as the flags give
        them."""

    def prepare(self, options: TargetOptions) -> Prepared:
        """Check and normalize typed options, reading (and hashing) the files they name once."""

    def options(self, raw: RawOptions) -> Options:
        """`--to FMT:SPEC`'s normalized options (what `prepare` records for what `parse` reads)."""

    def tool_versions(self) -> dict[str, str]:
        """Versions of the tools whose output this converter's result depends on."""

    def convert(self, request: ConversionRequest) -> ConversionResult:
        """Write the artifact into `request.workdir` and verify it against the source."""

    def convert_many(self, requests: Sequence[ConversionRequest]) -> list[ConversionResult]:
        """Several targets (same source, same workdir) in one pass; each result names every file it wrote."""

    def check_config(self, config: dict[str, Any], options: Options | None = None) -> None:
        """Refuse (UsageError), from config.json alone and before any weight is downloaded, a model this converter
        cannot take with these (normalized) options; None: checked as what another target needs."""

    def gate_problems(self, artifact: Artifact | None, requirement: str) -> list[str]:
        """Why `artifact` fails `--require FORMAT[:ARGS]` (None: the version has none); empty when it passes."""

    def mount_file(self, artifact: Artifact) -> str:
        """What an engine is pointed at, relative to the artifact directory ("." for the directory itself)."""

    def engine_file(self, label: str, artifact: Artifact, artifact_dir: Path | None) -> str:
        """What an engine on this machine opens, relative to the artifact directory.

        Where the format binds to hardware (TensorRT), the file built for the local GPU, its
        recorded binding checked in `artifact_dir` when the files are local (None: a remote store).
        """

    def open_session(self, artifact_dir: Path, artifact: Artifact, manifest: Manifest) -> Session:
        """Load the artifact with the runtime its format needs (for golden checks)."""


class ConverterBase:
    """Defaults for the optional parts of the protocol: one target at a time, no prerequisites, no runtime."""

    format: ClassVar[str]
    needs: ClassVar[tuple[str, ...]] = ()
    converts_many: ClassVar[bool] = False

    def parse(self, raw: RawOptions) -> TargetOptions:
        """Read by each converter."""
        raise NotImplementedError

    def apply_flags(self, options: TargetOptions, fields: Mapping[str, Any]) -> TargetOptions:
        """A flag wins over the spec; a tuple (gguf's budget) adds to it."""
        typed: Any = options  # the converters' frozen dataclasses
        flagged: TargetOptions = replace(typed, **{k: (*getattr(typed, k), *v) if isinstance(v, tuple) else v
                                                   for k, v in fields.items()})
        return flagged

    def prepare(self, options: TargetOptions) -> Prepared:
        """Checked by each converter."""
        raise NotImplementedError

    def options(self, raw: RawOptions) -> Options:
        """The string form's normalized options."""
        return self.prepare(self.parse(raw)).options

    def convert(self, request: ConversionRequest) -> ConversionResult:
        """Write and verify one target (converters implement this or `convert_many`)."""
        raise NotImplementedError

    def convert_many(self, requests: Sequence[ConversionRequest]) -> list[ConversionResult]:
        """One target after the other."""
        return [self.convert(r) for r in requests]

    def check_config(self, config: dict[str, Any], options: Options | None = None) -> None:
        """Any model: what the format cannot take is found when it converts."""

    def gate_problems(self, artifact: Artifact | None, requirement: str) -> list[str]:
        """A format requirement is met by the artifact's presence; arguments are not understood."""
        if artifact is None:
            return [f"no {self.format} artifact (required by --require {requirement})"]
        return []

    def mount_file(self, artifact: Artifact) -> str:
        """The artifact directory itself."""
        return "."

    def engine_file(self, label: str, artifact: Artifact, artifact_dir: Path | None) -> str:
        """The same on every machine: what `mount_file` says."""
        return self.mount_file(artifact)

    def open_session(self, artifact_dir: Path, artifact: Artifact, manifest: Manifest) -> Session:
        """No runtime for this format."""
        raise UsageError(f"no runtime for {self.format} artifacts in this build",
                         hint="run the golden check on another format of the version (--format)")


def main_file(artifact: Artifact, suffix: str) -> str:
    """The artifact's file named `suffix` or ending with it (the .gguf, model.onnx), else the directory."""
    for f in artifact.files:
        if f.path == suffix or f.path.endswith(suffix):
            return f.path
    return "."


def spec_of(fmt: str, raw: RawOptions, hint: str) -> str:
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
