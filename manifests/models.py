"""The records mreg writes: version manifests, alias records, history entries, pull records.

Every model is frozen and forbids unknown fields, so that a file written by a newer mreg
fails loudly instead of being half-understood. `schema_version` changes on any breaking change.
"""

from __future__ import annotations

import datetime as dt
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

SCHEMA_VERSION: Literal[1] = 1

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def _check_relative(path: str) -> str:
    parts = path.split("/")
    if not path or path.startswith("/") or "\\" in path or any(p in ("", ".", "..") for p in parts):
        raise ValueError(f"not a safe relative path: {path!r}")
    return path


RelPath = Annotated[str, AfterValidator(_check_relative)]
#: A format's name, as the registry's format table knows it (hf, gguf, onnx, tensorrt, …): a new format
#: is a converter package and a table row, not a change to the manifest's schema.
Format = Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")]
JSONValue = Any
#: What an older mreg wrote in `detail` of a GGUF that llama.cpp never loaded, with its status still `passed`.
LEGACY_NOT_LOADED = "llama.cpp runtime not installed"


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class FileEntry(_Record):
    """One file of an artifact tree, relative to the artifact's directory."""

    path: RelPath
    size: int = Field(ge=0)
    sha256: Sha256


class SourceFile(FileEntry):
    """One file of a source snapshot, with what the hub said about it."""

    lfs: bool = False
    git_blob_id: str | None = None


class SourceInfo(_Record):
    """Where a version came from: a hub repository pinned to a commit, or a local directory."""

    kind: Literal["hub", "local", "oci"]
    repo: str
    requested_revision: str | None = None
    commit: str
    endpoint: str | None = None
    files: tuple[SourceFile, ...]


class ConverterInfo(_Record):
    """Which converter made an artifact."""

    name: str
    version: str


class Verification(_Record):
    """How an artifact was checked against its source, and the numbers.

    `status`: `passed`, every check `method` names ran and passed; `failed`, one failed; `structural`, the
    artifact's integrity was checked (digests, layout, encoding) but its runtime never loaded it (llama.cpp not
    installed where it was converted); `unverified`, built but not run (TensorRT engines for GPUs not there).
    `method` names only what ran; `not_run` says in plain words what did not, and why.
    """

    status: Literal["passed", "failed", "structural", "unverified"]
    method: str
    reference: str
    inputs: tuple[str, ...] = ()
    metrics: dict[str, float] = Field(default_factory=dict)
    tolerance: dict[str, float] = Field(default_factory=dict)
    #: Quality figures' default budgets (a metric's name -> its largest value; `top1_agreement`: its smallest):
    #: reported against, never failing the conversion; a promotion gate can require them.
    budget: dict[str, float] = Field(default_factory=dict)
    detail: str | None = None
    #: Checks of this format that did not run here, each a plain sentence (`not loaded by llama.cpp: ...`); empty in
    #: manifests written before 2026-12-03, whose `method` could name checks that did not run (read `detail`).
    not_run: tuple[str, ...] = ()

    def _legacy(self) -> bool:
        return not self.not_run and self.detail is not None and LEGACY_NOT_LOADED in self.detail

    def unrun(self) -> tuple[str, ...]:
        """What did not run, in plain words; for a manifest of an older mreg, read from `detail`, which alone said
        that llama.cpp never loaded a GGUF it recorded as passed."""
        if self._legacy():
            return ("not loaded by llama.cpp: llama-cpp-python was not installed (an older mreg recorded it as "
                    "passed)",)
        return self.not_run

    def loaded(self) -> bool:
        """Whether the artifact's runtime loaded and ran it (`structural`, `unverified`: never, or not every part)."""
        return self.status in ("passed", "failed") and not self._legacy()


class TensorRTRequirements(_Record):
    """What a TensorRT engine needs to load."""

    kind: Literal["tensorrt"] = "tensorrt"
    backend: Literal["tensorrt", "tensorrt-rtx"]
    tensorrt_version: str
    cuda: str | None = None
    compute_capabilities: tuple[str, ...]
    hardware_compatibility: str = "none"
    version_compatible: bool = False
    precision: str
    built_on_gpu: str | None = None
    profiles: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]] = Field(default_factory=dict)
    #: The ONNX files the engines were built from (path -> sha256), as they are in this version's onnx artifact.
    onnx_files: dict[str, Sha256] = Field(default_factory=dict)
    #: Compute capability (`sm_86`) -> its plan, relative to the artifact's directory.
    engines: dict[str, RelPath] = Field(default_factory=dict)
    #: Compute capability -> seconds the builder took for that engine.
    build_s: dict[str, float] = Field(default_factory=dict)
    #: Compute capability -> `warm` or `cold` (the timing cache found or not), or `none` (not used).
    timing_cache: dict[str, str] = Field(default_factory=dict)
    #: How a reduced-precision graph was made from the ONNX artifact (strongly typed networks), if it was.
    precision_conversion: str | None = None


class EngineRecord(BaseModel):
    """The binding of one TensorRT plan, written beside it as `engine.json` (checked before load or promotion)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    backend: Literal["tensorrt", "tensorrt-rtx"]
    tensorrt_version: str
    cuda: str | None = None
    compute_capability: str
    hardware_compatibility: str = "none"
    version_compatible: bool = False
    precision: str
    built_on_gpu: str | None = None
    profiles: dict[str, tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]]
    onnx_files: dict[str, str]
    plan_sha256: str
    plan_bytes: int
    build_s: float
    timing_cache: str
    #: What the builder logged at warning level or above (e.g. TensorRT for RTX probing for a GPU that is absent).
    builder_messages: tuple[str, ...] = ()


class GGUFCandidate(_Record):
    """One type `gguf:auto` considered: its planned size and, when it was converted and verified, its quality."""

    type: str
    #: The file's tensor data as planned (known for every candidate before any is written).
    tensor_bytes: int = Field(ge=0)
    #: The whole file's size, when it was written.
    file_bytes: int | None = Field(default=None, ge=0)
    tried: bool = False
    #: Whether its measured figures meet the budget (None: not tried).
    meets: bool | None = None
    metrics: dict[str, float] = Field(default_factory=dict)


class GGUFSelection(_Record):
    """How `gguf:auto` chose the file's type: the budget, every candidate, the search and the chart."""

    budget: dict[str, float]
    chosen: str
    #: `bisection`: candidates in planned-size order, halved by whether the middle one meets the budget.
    search: str
    tried: int = Field(ge=0)
    candidates: tuple[GGUFCandidate, ...]
    #: The trade-off as an SVG chart, relative to the artifact's directory.
    chart: RelPath | None = None


class GGUFImportance(_Record):
    """The importance matrix a GGUF file was quantized with (a file of the version, in llama.cpp's format)."""

    #: The file, relative to the artifact directory (`<name>.imatrix.gguf`, or `.dat` as llama-imatrix gave it).
    file: RelPath
    sha256: str
    #: `mreg` (computed from a calibration text by mreg's float32 forward pass) or `given` (`--imatrix FILE`: made
    #: elsewhere, by llama-imatrix or an earlier mreg run; nothing in the file proves which). `llama-imatrix` is how
    #: manifests written before 2026-12-02 labelled a given file.
    made_by: Literal["mreg", "given", "llama-imatrix"]
    #: The calibration text's name as the file records it, its sha256 and token count (when mreg made it).
    dataset: str | None = None
    dataset_sha256: str | None = None
    tokens: int | None = None
    chunks: int = Field(ge=0)
    chunk_size: int = Field(ge=0)
    #: Matrices it has data for.
    entries: int = Field(ge=0)
    seconds: float = Field(ge=0)


class GGUFRequirements(_Record):
    """What a GGUF file needs to load."""

    kind: Literal["gguf"] = "gguf"
    architecture: str
    quantization: str
    tensor_types: dict[str, int] = Field(default_factory=dict)
    fallbacks: dict[str, str] = Field(default_factory=dict)
    #: Set when the type was chosen by budget (`--to gguf:auto`).
    selection: GGUFSelection | None = None
    imatrix: GGUFImportance | None = None


class BuildGpu(_Record):
    """One GPU of the machine that built an artifact, as its driver names it."""

    product: str
    compute_capability: str | None = None
    memory_mib: int | None = Field(default=None, ge=0)


class BuildMachine(_Record):
    """The machine that built an artifact: recorded for people and audits, never part of the conversion key."""

    host: str
    os: str | None = None
    arch: str | None = None
    cpu: str | None = None
    #: The CPU's flags that matter to conversion kernels (SIMD widths, fp16 and int8 dot products), sorted.
    cpu_flags: tuple[str, ...] = ()
    cpus: int = Field(default=0, ge=0)
    gpus: tuple[BuildGpu, ...] = ()
    #: The NVIDIA driver's version and the CUDA version it supports, where a driver answered.
    driver: str | None = None
    cuda: str | None = None
    #: TensorRT distributions installed (name -> version); the engines' requirements name the one used.
    tensorrt: dict[str, str] = Field(default_factory=dict)
    mreg_version: str
    python: str | None = None


class Artifact(_Record):
    """One format of a version: its files, how it was made, what it needs, how it was verified."""

    format: Format
    path: RelPath
    files: tuple[FileEntry, ...]
    converter: ConverterInfo
    options: dict[str, JSONValue] = Field(default_factory=dict)
    tool_versions: dict[str, str] = Field(default_factory=dict)
    duration_s: float = Field(ge=0)
    requirements: Annotated[TensorRTRequirements | GGUFRequirements, Field(discriminator="kind")] | None = None
    verification: Verification
    #: Bytes of the weights an engine loads (GGUF: the file's tensor data; hf: the safetensors files; ONNX: the
    #: initializers), for serving-memory planning without opening the files; None in older manifests.
    weights_bytes: int | None = Field(default=None, ge=0)
    #: The machine that built it (a carried artifact keeps its builder's); None in manifests before 2026-12-03.
    built_on: BuildMachine | None = None


class Provenance(_Record):
    """Who made a record, when, on what host, with which mreg."""

    user: str
    host: str
    at: dt.datetime
    mreg_version: str
    python: str


class KVCache(_Record):
    """KV-cache bytes per token of a decoder, derived from its config (see registry.convert.kvcache).

    A sequence of n tokens holds `bytes_per_token[dtype] * n + window_bytes_per_token[dtype] * min(n, window)`:
    full-attention layers cache every token, sliding-window layers at most `sliding_window` of them.
    """

    #: Cache dtype (f16, q8_0, q4_0) -> bytes per token of the layers that cache every token.
    bytes_per_token: dict[str, int]
    #: The same for the sliding-window layers (empty when there are none).
    window_bytes_per_token: dict[str, int] = Field(default_factory=dict)
    sliding_window: int | None = Field(default=None, ge=1)
    layers: int = Field(ge=0)
    full_layers: int = Field(ge=0)
    window_layers: int = 0
    #: Layers with no per-token cache (linear attention, state-space): their fixed-size state is not counted.
    uncached_layers: int = 0
    kv_heads: int = Field(ge=0)
    head_dim: int = Field(ge=0)
    #: `mha` (K and V per KV head) or `mla` (one compressed latent plus the rope key per layer).
    attention: Literal["mha", "mla"] = "mha"
    notes: tuple[str, ...] = ()


class ModelInfo(_Record):
    """What serving engines need to know of the model itself, read from the source's config at conversion."""

    architecture: str | None = None
    model_type: str | None = None
    context_length: int | None = None
    tokenizer: str | None = None
    tokenizer_files: tuple[str, ...] = ()
    chat_template: bool = False
    #: For decoders whose config names their attention shape; None for encoders and older manifests.
    kv_cache: KVCache | None = None


class Manifest(_Record):
    """A complete, immutable version of a model: written last, its presence publishes the version."""

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str
    version: int = Field(ge=1)
    key: Sha256
    parent: int | None = None
    source: SourceInfo
    artifacts: tuple[Artifact, ...]
    model: ModelInfo | None = None
    created: Provenance


class GateResult(_Record):
    """One gate evaluated before a rollout step: the gate as given, whether it held, and the value it saw."""

    gate: str
    passed: bool
    value: float | None = None
    detail: str = ""


class RolloutStep(_Record):
    """What a rollout entry of the history records: the two versions, the canary's weight, the gates' values."""

    stable: int
    canary: int
    weight: int = Field(ge=0, le=100)
    step: int = Field(ge=-1)
    gates: tuple[GateResult, ...] = ()


#: The actions of a staged rollout, recorded on the main alias (whose target they leave as it is, but the last).
ROLLOUT_ACTIONS = ("rollout-start", "rollout-step", "rollout-pause", "rollout-resume", "rollout-abort",
                   "rollout-done")


class HistoryEntry(_Record):
    """One alias change, appended to `history.jsonl`; a rollout's steps carry `rollout` (an older entry has none)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    alias: str
    action: Literal["promote", "rollback", "repair", "sync", "rollout-start", "rollout-step", "rollout-pause",
                    "rollout-resume", "rollout-abort", "rollout-done"]
    from_version: int | None = Field(alias="from")
    to_version: int = Field(alias="to")
    reason: str | None = None
    by: Provenance
    #: Left out when None: an entry that is no rollout step is written as before, so an older mreg still reads it.
    rollout: RolloutStep | None = Field(default=None, exclude_if=lambda v: v is None)

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)



class RolloutRecord(_Record):
    """The staged rollout of one alias: the canary's weight is the commit, changed by compare-and-swap.

    Kept after it ends (`done`, `aborted`) until the next rollout of the alias, so that an apply that a crash cut
    short can be run again for the recorded weight.
    """

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str
    alias: str
    stable: int = Field(ge=1)
    canary: int = Field(ge=1)
    steps: tuple[int, ...]
    #: Index in `steps` of the weight in force; -1 before the first step (weight 0).
    step: int = Field(ge=-1)
    weight: int = Field(ge=0, le=100)
    state: Literal["running", "paused", "done", "aborted"]
    #: Whether the apply command ran to success for this weight (False: a crash or a failure cut it short).
    applied: bool = False
    interval_s: float = Field(ge=0)
    gates: tuple[str, ...] = ()
    apply: str | None = None
    #: What the apply command reads on its standard input: a `rollout render` target (None: the JSON state).
    apply_target: str | None = None
    reason: str | None = None
    started: Provenance
    changed: Provenance


class PullRecord(_Record):
    """What `mreg pull` verified about a cached snapshot, kept beside the hub cache."""

    schema_version: Literal[1] = SCHEMA_VERSION
    source: SourceInfo
    skipped: tuple[str, ...] = ()
    pulled: Provenance
    #: Local imports: each file's (size, mtime_ns, ctime_ns, device, inode) when it was hashed, so an unchanged
    #: directory is not read again and a linked snapshot is trusted only while they all still hold.
    local_stat: dict[str, tuple[int, int, int, int, int]] = Field(default_factory=dict)
    #: A local import whose snapshot links to the directory's own files instead of copies in the cache.
    linked: bool = False


class AliasRecord(_Record):
    """One alias in a remote store: its target and its own history, replaced as a whole by compare-and-swap."""

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str
    alias: str
    version: int
    manifest_sha256: Sha256
    history: tuple[HistoryEntry, ...] = ()
    #: The alias's staged rollout (S3: in the alias's own record, so that a step and its entry are one write).
    rollout: RolloutRecord | None = Field(default=None, exclude_if=lambda v: v is None)

