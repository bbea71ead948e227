"""A conversion matrix file, validated, and its items in a fixed order.

```toml
store = "s3://models/prod"                      # or a directory (relative: to this file)
[[models]]
name = "qwen"
source = "Qwen/Qwen2.5-0.5B-Instruct@main"      # ORG/NAME[@REVISION], or a directory (./ relative to this file)
targets = ["hf", "gguf:Q4_K_M", "tensorrt:precision=fp16"]
gpus = ["NVIDIA-H100-80GB-HBM3", "sm_89"]       # TensorRT targets: one item per entry
```

Items are numbered model by model, target by target, GPU by GPU: the numbering is what
`mreg convert --matrix M.toml --item N` and every emitted document refer to, so it depends on the
file alone (never on the store, the hub or the machine).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from registry import layout
from registry.errors import NotFound, UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: A compute capability as TensorRT's targets spell it (sm_90, sm90, 9.0): built ahead of time, on any machine.
COMPUTE_CAPABILITY = re.compile(r"^(sm_?\d{2,3}|\d{1,2}\.\d)$")
#: A GPU product as the NVIDIA GPU operator labels nodes (nvidia.com/gpu.product): built on that GPU.
PRODUCT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
#: Hub repository ids with their organization (a bare `name` would read as a version of the store's model `name`).
HUB_SOURCE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[^\s@]+)?$")
LOCAL_PREFIXES = ("./", "../", "/", "~", "file://")
HINT = ("a matrix is `store = \"DIR|s3://…\"` and [[models]] tables with name, source (ORG/NAME[@REV] or ./DIR), "
        "targets (a list of --to forms) and optional gpus; see docs/guides/ci-matrix.md")

def _model_name(value: str) -> str:
    """A model name as the store takes it (layout.NAME_RE, matched in Python: pydantic's regex engine has no \\Z)."""
    if not layout.NAME_RE.match(value):
        raise ValueError(f"{value!r} is not a model name (letters, digits, '.', '_', '-'; 128 at most)")
    return value


Name = Annotated[str, AfterValidator(_model_name)]


class ModelEntry(BaseModel):
    """One `[[models]]` table."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Name
    source: Annotated[str, Field(min_length=1, max_length=4096)]
    targets: Annotated[list[Annotated[str, Field(min_length=1, max_length=1024)]], Field(min_length=1)]
    gpus: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(default_factory=list)


class MatrixFile(BaseModel):
    """The whole file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    store: Annotated[str, Field(min_length=1, max_length=4096)]
    models: Annotated[list[ModelEntry], Field(min_length=1)]


@dataclass(frozen=True)
class Need:
    """What an item's machine must have: nothing special (CPU), or a GPU (a product, a compute capability, any)."""

    kind: Literal["cpu", "gpu"]
    product: str | None = None
    compute_capability: str | None = None

    @property
    def label(self) -> str:
        """`cpu`, the product, the compute capability, or `gpu` (any NVIDIA GPU)."""
        return "cpu" if self.kind == "cpu" else self.product or self.compute_capability or "gpu"


@dataclass(frozen=True)
class Item:
    """One conversion of the matrix: one model, one `--to` target (with its GPU folded into the spec)."""

    index: int
    name: str
    #: The source as `mreg convert` takes it: a hub id, or an absolute directory.
    source: str
    target: str
    need: Need
    #: Where in the file it comes from (`models[0].targets[2]`), for messages.
    where: str

    @property
    def id(self) -> str:
        """A readable identity, unique in its matrix: `qwen/gguf:Q4_K_M`."""
        return f"{self.name}/{self.target}"


@dataclass(frozen=True)
class Matrix:
    """A matrix file read and expanded."""

    path: Path
    text: str
    store: str
    items: tuple[Item, ...]


def load(path: Path) -> Matrix:
    """Read, validate and expand a matrix file; any problem is one usage error naming its key."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise NotFound(f"matrix file {path} does not exist", hint="give the path of a matrix TOML file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"matrix file {path} cannot be read: {e}", hint=HINT) from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UsageError(f"{path} is not valid TOML: {e}", hint=HINT) from None
    try:
        parsed = MatrixFile.model_validate(raw)
    except ValidationError as e:
        problems = [f"{_where(err['loc'])}: {_say(err['type'], err['msg'])}" for err in e.errors()]
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise UsageError(f"{path}: " + "; ".join(problems[:3]) + more, hint=HINT) from None
    base = path.resolve().parent
    return Matrix(path, text, _local(parsed.store, base) if not parsed.store.startswith("s3://") else parsed.store,
                  tuple(expand(parsed, base, path)))


def expand(parsed: MatrixFile, base: Path, path: Path) -> list[Item]:
    """Every item in order; repeated items and GPUs given to a matrix without TensorRT targets are refused."""
    items: list[Item] = []
    seen: dict[tuple[str, str], str] = {}
    for m, model in enumerate(parsed.models):
        source = _source(model.source, base, f"{path}: models[{m}].source")
        if model.gpus and not any(t.partition(":")[0] == "tensorrt" for t in model.targets):
            raise UsageError(f"{path}: models[{m}].gpus is given but no target is tensorrt",
                             hint="gpus says which GPUs TensorRT engines are built for; drop it or add a tensorrt "
                                  "target")
        for t, target in enumerate(model.targets):
            where = f"models[{m}].targets[{t}]"
            for spec, need in _per_gpu(target, model.gpus, f"{path}: {where}", m):
                identity = (model.name, spec)
                if identity in seen:
                    raise UsageError(f"{path}: {where} repeats {seen[identity]} ({model.name} --to {spec})",
                                     hint="give each model's target once")
                seen[identity] = where
                items.append(Item(len(items), model.name, source, spec, need, where))
    return items


def _per_gpu(target: str, gpus: list[str], where: str, m: int) -> list[tuple[str, Need]]:
    """The target as items: a TensorRT target once per GPU entry (its builder and target folded into the spec)."""
    fmt, _, spec = target.partition(":")
    if fmt != "tensorrt":
        return [(target, Need("cpu"))]
    tokens = dict(tok.partition("=")[::2] for tok in spec.split(",") if tok.strip())
    backend = tokens.get("backend", "tensorrt-rtx")
    if not gpus:
        if "target" not in tokens:
            return [(target, Need("gpu"))]  # the local GPU's compute capability: any GPU will do
        if backend == "tensorrt-rtx":
            return [(target, Need("cpu"))]  # ahead of time, for the named compute capabilities
        return [(target, Need("gpu", compute_capability=tokens["target"]))]
    if "target" in tokens or "backend" in tokens:
        raise UsageError(f"{where} sets target= or backend= and models[{m}].gpus is given",
                         hint="with gpus, each entry picks the engine's target: a compute capability (sm_89) builds "
                              "ahead of time with TensorRT for RTX, a GPU product builds on that GPU with TensorRT")
    out = []
    for g, gpu in enumerate(gpus):
        joined = f"{spec}," if spec else ""
        if COMPUTE_CAPABILITY.match(gpu):
            out.append((f"tensorrt:{joined}target={gpu}", Need("cpu")))
        elif PRODUCT.match(gpu):
            out.append((f"tensorrt:{joined}backend=tensorrt", Need("gpu", product=gpu)))
        else:
            raise UsageError(f"{where.rsplit(':', 1)[0]}: models[{m}].gpus[{g}] {gpu!r} is neither a compute "
                             "capability nor a GPU product name",
                             hint="a compute capability (sm_89, 8.9) or a product as nvidia.com/gpu.product labels "
                                  "it (NVIDIA-H100-80GB-HBM3)")
    return out


def _source(text: str, base: Path, where: str) -> str:
    """A hub id as given; a directory made absolute against the matrix file's own directory."""
    if text.startswith(LOCAL_PREFIXES):
        return _local(text.removeprefix("file://"), base)
    if HUB_SOURCE.match(text):
        return text
    raise UsageError(f"{where} {text[:80]!r} is neither ORG/NAME[@REVISION] nor a directory",
                     hint="write hub repositories with their organization, and directories starting with ./ or /")


def _local(text: str, base: Path) -> str:
    return str((base / Path(text).expanduser()).resolve())


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _say(kind: str, msg: str) -> str:
    return {"extra_forbidden": "unknown key", "missing": "missing"}.get(kind, msg)


def pick(matrix: Matrix, item: int, among: list[int] | None = None) -> Item:
    """The item `--item N` names (with `--among I0,I1,…`: the Nth of those, as an Indexed Job's index reaches it)."""
    if among is not None:
        if not 0 <= item < len(among):
            raise UsageError(f"--item {item} is outside --among ({len(among)} items)",
                             hint="--item counts from 0 through the --among list")
        item = among[item]
    if not 0 <= item < len(matrix.items):
        raise UsageError(f"{matrix.path} has {len(matrix.items)} items; --item {item} is not one of them",
                         hint=f"run `mreg plan {matrix.path}` to see them")
    return matrix.items[item]
