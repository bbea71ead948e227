"""Importance matrices: how much each input column of every quantized matrix matters, as llama.cpp's quantizer uses it.

An importance matrix holds, for each matrix `blk.N.*.weight` that a model multiplies its
activations by, the sum over calibration tokens of each input column's squared activation
(`in_sum2`) and how many tokens were summed (`counts`); a mixture's stacked experts have one row
of each per expert, counted over the tokens routed to it. The quantizer weights each column's
rounding error by `in_sum2 / counts` (see `converters.gguf.quants.quantize`).

mreg computes it with its own streaming float32 forward pass (`converters.gguf.reference`, one
layer's weights at a time, one chunk of tokens at a time), on the text as llama-imatrix reads it:
tokenized with the model's own tokenizer (BOS added where the model adds one), cut into chunks of
`chunk_size` tokens (the remainder dropped), the first token of each chunk replaced by BOS; the
output matrix is left out, as llama-imatrix leaves it out by default. The file is llama.cpp's
(tools/imatrix/imatrix.cpp, `--output-format gguf`):

```
GGUF v3: general.type = "imatrix", imatrix.datasets = [name], imatrix.chunk_count, imatrix.chunk_size
tensors, sorted by name:  <name>.in_sum2  F32 [ncols, nmat]     <name>.counts  F32 [1, nmat]
                          (a dense matrix, nmat = 1: [ncols] and [1], as ggml drops trailing ones)
```
`read` takes that format and llama-imatrix's legacy `.dat` (mean values times the number of chunks).
"""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from converters.gguf.file import HashingWriter, TensorInfo, header
from converters.gguf.model import _EXPERT, ModelPlan
from converters.gguf.quants.blocks import Floats
from registry.config import inherited, python_path
from registry.digest import file_chunks, write_hashed
from registry.errors import MregError, UsageError
from registry.inputs import open_input

#: The calibration text mreg ships (`--calibration default`), and llama-imatrix's default chunk size.
DEFAULT_CALIBRATION = Path(__file__).parent / "data" / "calibration.txt"
DEFAULT_CHUNK = 512
#: llama-imatrix ignores a dense product of fewer rows (`src1->ne[1] < 16`): a chunk must be at least this long.
MIN_CHUNK = 16


class InvalidImportance(UsageError):
    """A file given as an importance matrix is not one, or does not fit the model, or the text is too short."""


class ImportanceFailed(MregError):
    """Computing the importance matrix failed (its child process died)."""


@dataclass
class Importance:
    """Squared-activation sums and token counts per matrix (GGUF names), and how they were gathered."""

    sums: dict[str, Floats] = field(default_factory=dict)
    counts: dict[str, np.ndarray[Any, np.dtype[np.float64]]] = field(default_factory=dict)
    datasets: list[str] = field(default_factory=list)
    chunk_count: int = 0
    chunk_size: int = 0
    #: Read from llama-imatrix's legacy .dat: sums hold mean values times the chunk count, counts that count.
    legacy: bool = False

    def weights(self, name: str) -> Floats | None:
        """(nmat, ncols) per-column weights of a tensor as llama.cpp's quantize tool derives them, or None.

        GGUF: in_sum2 / counts in float32 (a row never reached counts as all ones); legacy: value / ncall.
        """
        if name not in self.sums:
            return None
        sums = self.sums[name].astype(np.float32)
        counts = self.counts[name].astype(np.float32)
        if self.legacy:
            ncall = counts[0] if counts.size else np.float32(0)
            return sums / ncall if ncall > 0 else sums
        out = np.ones_like(sums)
        seen = counts > 0
        out[seen] = sums[seen] / counts[seen][:, None]
        return out


class Collector:
    """Accumulates the inputs of every `blk.*` matrix the forward pass multiplies (reference.forward's observer)."""

    def __init__(self, model: ModelPlan) -> None:
        self.names = {t.source_name: t for t in model.tensors if t.source_name}
        self.importance = Importance()
        self._sums: dict[str, np.ndarray[Any, np.dtype[np.float64]]] = {}

    def __call__(self, hf_name: str, x: Floats) -> None:
        expert = 0
        found = _EXPERT.fullmatch(hf_name)
        if found is not None:
            expert = int(found[3])
            hf_name = (f"model.layers.{found[1]}.mlp.experts.{found[4]}.weight" if found[2] == "mlp"
                       else f"layers.{found[1]}.feed_forward.experts.{found[4]}.weight")
        t = self.names.get(hf_name)
        if t is None or not t.name.startswith("blk.") or len(t.shape) < 2:
            return
        nmat = t.shape[0] if len(t.shape) == 3 else 1
        if t.name not in self._sums:
            self._sums[t.name] = np.zeros((nmat, x.shape[-1]), np.float64)
            self.importance.counts[t.name] = np.zeros(nmat, np.float64)
        rows = x.reshape(-1, x.shape[-1]).astype(np.float64)
        self._sums[t.name][expert] += np.einsum("ij,ij->j", rows, rows)
        self.importance.counts[t.name][expert] += rows.shape[0]

    def result(self, dataset: str, chunk_count: int, chunk_size: int) -> Importance:
        """What was gathered (sums rounded to float32, as the file stores them)."""
        imp = self.importance
        imp.sums = {k: v.astype(np.float32) for k, v in self._sums.items()}
        imp.datasets, imp.chunk_count, imp.chunk_size = [dataset], chunk_count, chunk_size
        return imp


def chunks(ids: list[int], chunk_size: int, bos: int | None) -> list[list[int]]:
    """The text's tokens as llama-imatrix feeds them: whole chunks only, each starting with BOS where the model adds
    one."""
    out = []
    for i in range(len(ids) // chunk_size):
        chunk = ids[i * chunk_size:(i + 1) * chunk_size]
        if bos is not None:
            chunk[0] = bos
        out.append(chunk)
    return out


def write(path: Path, imp: Importance) -> str:
    """The importance matrix in llama.cpp's GGUF format; its sha256."""
    metadata: list[tuple[str, Any]] = [("general.type", "imatrix"), ("imatrix.datasets", imp.datasets or ["?"]),
                                       ("imatrix.chunk_count", imp.chunk_count),
                                       ("imatrix.chunk_size", imp.chunk_size)]
    infos, blobs = [], []
    for name in sorted(imp.sums):
        sums = np.ascontiguousarray(imp.sums[name], np.float32)
        counts = np.ascontiguousarray(imp.counts[name], np.float32)
        # ggml writes no trailing dimension of 1: a dense matrix's are [ncols] and [1]
        experts = (sums.shape[0],) if sums.shape[0] > 1 else ()
        infos += [TensorInfo(f"{name}.in_sum2", (sums.shape[1], *experts), "F32", sums.nbytes),
                  TensorInfo(f"{name}.counts", (1, *experts), "F32", counts.nbytes)]
        blobs += [sums.tobytes(), counts.tobytes()]
    with HashingWriter(path) as out:
        out.write(header(metadata, infos))
        for blob in blobs:
            out.write(blob)
            out.pad()
        return out.close()


def read(path: Path) -> Importance:
    """An importance matrix made by llama-imatrix or mreg (GGUF, or the legacy .dat), checked for sense."""
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise InvalidImportance(f"cannot read {path}: {e.strerror}", hint="give a file made by llama-imatrix") from e
    imp = _read_gguf(path) if magic == b"GGUF" else _read_legacy(path)
    for name, sums in imp.sums.items():
        counts = imp.counts[name]
        if sums.ndim != 2 or counts.shape != (sums.shape[0],) or not sums.size:
            raise InvalidImportance(f"{path.name}: {name} has {sums.shape} sums for {counts.shape} counts",
                                    hint="the file is damaged; make it again with llama-imatrix or --calibration")
        if not (np.isfinite(sums).all() and np.isfinite(counts).all()) or (sums < 0).any() or (counts < 0).any():
            raise InvalidImportance(f"{path.name}: {name} holds negative, NaN or infinite values",
                                    hint="the file is damaged; make it again with llama-imatrix or --calibration")
    if not imp.sums:
        raise InvalidImportance(f"{path.name} holds no importance data", hint="give a file made by llama-imatrix")
    return imp


def _read_gguf(path: Path) -> Importance:
    import gguf

    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # gguf's reader raises ValueError, struct.error, IndexError on damage
        raise InvalidImportance(f"{path.name} is not a readable GGUF file: {type(e).__name__}",
                                hint="give a file made by llama-imatrix (GGUF or .dat)") from e

    def value(key: str) -> Any:
        f = reader.fields.get(key)
        return None if f is None else f.contents()

    if value("general.type") != "imatrix" or value("imatrix.chunk_size") is None:
        raise InvalidImportance(f"{path.name} is a GGUF file but not an importance matrix (general.type "
                                f"{value('general.type')!r})", hint="give the .gguf that llama-imatrix wrote")
    data = {t.name: t for t in reader.tensors}
    imp = Importance(datasets=list(value("imatrix.datasets") or []), chunk_count=int(value("imatrix.chunk_count") or 0),
                     chunk_size=int(value("imatrix.chunk_size")))
    for key, t in data.items():
        if not key.endswith(".in_sum2"):
            continue
        name = key[: -len(".in_sum2")]
        c = data.get(name + ".counts")
        if c is None or t.tensor_type.name != "F32" or c.tensor_type.name != "F32":
            raise InvalidImportance(f"{path.name}: {name} lacks F32 counts or sums",
                                    hint="give a file made by llama-imatrix")
        counts = np.asarray(c.data, np.float32).reshape(-1)
        ncols = int(t.shape[0])
        sums = np.asarray(t.data, np.float32).reshape(-1)
        if not counts.size or sums.size != ncols * counts.size:
            raise InvalidImportance(f"{path.name}: {name} has {sums.size} sums for {counts.size} counts",
                                    hint="the file is damaged; make it again")
        imp.sums[name] = sums.reshape(counts.size, ncols).copy()
        imp.counts[name] = np.round(counts).astype(np.float64)  # llama.cpp reads them with lround
    return imp


def _read_legacy(path: Path) -> Importance:
    """llama-imatrix's `--output-format dat`: n, then n x (name, ncall, nval, values), then chunks and dataset."""
    raw = path.read_bytes()
    at = 0

    def take(fmt: str) -> Any:
        nonlocal at
        size = struct.calcsize(fmt)
        if at + size > len(raw):
            raise InvalidImportance(f"{path.name} ends early: not an importance matrix",
                                    hint="give a file made by llama-imatrix (GGUF or .dat)")
        out = struct.unpack_from(fmt, raw, at)
        at += size
        return out

    (n,) = take("<i")
    if not 0 < n < 1 << 20:
        raise InvalidImportance(f"{path.name} is not an importance matrix", hint="give a file made by llama-imatrix")
    imp = Importance(legacy=True)
    for _ in range(n):
        (length,) = take("<i")
        if not 0 < length < 4096:
            raise InvalidImportance(f"{path.name} is not an importance matrix",
                                    hint="give a file made by llama-imatrix")
        name = bytes(take(f"<{length}s")[0]).decode("utf-8", "replace")
        ncall, nval = take("<ii")
        if nval < 1 or at + 4 * nval > len(raw):
            raise InvalidImportance(f"{path.name}: {name} has {nval} values", hint="the file is damaged; make it again")
        values = np.frombuffer(raw, "<f4", nval, at).astype(np.float32)
        at += 4 * nval
        imp.sums[name] = values.reshape(1, -1).copy()
        imp.counts[name] = np.array([max(0, ncall)], np.float64)
    if at + 8 <= len(raw):
        (imp.chunk_count,) = take("<i")
        (length,) = take("<i")
        if 0 < length <= len(raw) - at:
            imp.datasets = [raw[at:at + length].decode("utf-8", "replace")]
    return imp


def check_fits(imp: Importance, model: ModelPlan, source: str) -> None:
    """Every entry of a matrix the model has must fit it (llama.cpp's quantizer refuses a size mismatch)."""
    shapes = {t.name: t.shape for t in model.tensors}
    for name, sums in imp.sums.items():
        shape = shapes.get(name)
        if shape is None or len(shape) < 2 or name == "token_embd.weight":
            continue
        want = shape[-1] * (shape[0] if len(shape) == 3 else 1)
        if sums.size != want:
            raise InvalidImportance(f"the importance matrix {source} has {sums.size} values for {name}, which takes "
                                    f"{want}: it was made for another model",
                                    hint="make it from this model (--calibration FILE), or give this model's imatrix")


@dataclass(frozen=True)
class Computed:
    """What computing an importance matrix did."""

    sha256: str
    tokens: int
    chunks: int
    seconds: float


def compute(directory: Path, text: Path, dest: Path, chunk_size: int, dataset: str) -> Computed:
    """Compute the importance matrix of the model in `directory` on a text, in a child process; write it to dest.

    The child holds BLAS to one thread (the forward pass has its own pool, see reference.py) and
    keeps the parent's memory flat; its failure is one line here.
    """
    root = Path(__file__).resolve().parents[2]
    env = inherited(PYTHONPATH=python_path(root), OPENBLAS_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "converters.gguf.imatrix", str(directory), str(text), str(dest), str(chunk_size),
           dataset]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        from converters.gguf.llama import describe_exit

        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ImportanceFailed(f"computing the importance matrix failed ({describe_exit(done.returncode)}): {tail}",
                               hint="nothing was published; MREG_DEBUG=1 shows more")
    doc = json.loads(lines[-1])
    if "error" in doc:
        raise InvalidImportance(f"the importance matrix cannot be computed: {doc['error']}", hint=doc["hint"])
    return Computed(doc["sha256"], doc["tokens"], doc["chunks"], doc["seconds"])


def _child(directory: Path, text: Path, dest: Path, chunk_size: int, dataset: str) -> dict[str, Any]:
    """The child's work: tokenize, chunk, run the forward pass with the collector, write the file."""
    import time

    from converters.gguf.plan import plan
    from converters.gguf.reference import ReferenceUnsupported, forward
    from converters.gguf.tokenization import reference

    t0 = time.monotonic()
    p = plan(directory, sorted(directory.rglob("*.safetensors")), "F32", "m")
    tokenize: Callable[[str], list[int]] | None = reference(directory).encode
    if tokenize is None:
        return {"error": "no tokenizer library (tokenizers/sentencepiece) to tokenize the calibration text",
                "hint": "pip install 'mreg[gguf]'"}
    meta = dict(p.metadata)
    ids = list(tokenize(text.read_text(encoding="utf-8")))
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", p.vocab.model == "llama"))
    bos = meta.get("tokenizer.ggml.bos_token_id") if add_bos else None
    if len(ids) < 2 * chunk_size:
        return {"error": f"the calibration text is {len(ids)} tokens, and llama-imatrix wants at least two chunks "
                         f"of {chunk_size}", "hint": "give a longer text, or a smaller --calibration-ctx"}
    pieces = chunks(ids, chunk_size, int(bos) if bos is not None else None)
    collector = Collector(p.model)
    try:
        forward(directory, pieces, observe=collector, head=False)
    except ReferenceUnsupported as e:
        return {"error": str(e), "hint": "give an importance matrix made by llama-imatrix (--imatrix FILE)"}
    imp = collector.result(dataset, len(pieces), chunk_size)
    bad = [n for n, s in imp.sums.items() if not np.isfinite(s).all()]
    if bad:  # llama-imatrix stops on these too
        return {"error": f"non-finite activations in {bad[0]}", "hint": "the model's weights overflow float32"}
    digest = write(dest, imp)
    return {"sha256": digest, "tokens": len(ids), "chunks": len(pieces), "entries": len(imp.sums),
            "seconds": round(time.monotonic() - t0, 3)}


#: File types whose encoders read no importance weights: an importance matrix changes nothing in them.
UNWEIGHTED_FILE_TYPES = ("F32", "F16", "BF16", "Q8_0")
_HINT = "use --calibration FILE (or default) [--calibration-ctx N], or --imatrix FILE from llama-imatrix"


def options(file_type: str, tokens: dict[str, str]) -> tuple[dict[str, Any], dict[str, Path]]:
    """`calibration=PATH|default`, `calibration-ctx=N`, `imatrix=PATH` -> the options recorded (digests, not paths),
    and the file each digest was read from (hashed here, once).

    For file types whose encoders read no weights (F16, Q8_0, ...) the importance matrix is dropped: it would
    change nothing but the conversion key.
    """
    unknown = sorted(set(tokens) - {"calibration", "calibration-ctx", "imatrix"})
    if unknown:
        raise UsageError(f"--to gguf:{file_type} does not take {', '.join(unknown)}", hint=_HINT)
    if "calibration" in tokens and "imatrix" in tokens:
        raise UsageError("--calibration and --imatrix are two ways to one importance matrix: give one", hint=_HINT)
    if "calibration-ctx" in tokens and "calibration" not in tokens:
        raise UsageError("--calibration-ctx goes with --calibration", hint=_HINT)
    out: dict[str, Any] = {}
    files: dict[str, Path] = {}
    if "calibration" in tokens:
        path = DEFAULT_CALIBRATION if tokens["calibration"] == "default" else Path(tokens["calibration"]).expanduser()
        ctx = tokens.get("calibration-ctx", str(DEFAULT_CHUNK))
        if not (ctx.isascii() and ctx.isdigit() and len(ctx) <= 9) or int(ctx) < MIN_CHUNK:
            raise UsageError(f"--calibration-ctx {ctx}: a whole number of tokens, at least {MIN_CHUNK}",
                             hint=f"llama-imatrix's default is {DEFAULT_CHUNK}")
        digest = hash_given(path, "--calibration")
        out["calibration"] = {"sha256": digest, "name": path.name, "chunk_size": int(ctx)}
        files[digest] = path.resolve()
    elif "imatrix" in tokens:
        path = Path(tokens["imatrix"]).expanduser()
        digest = hash_given(path, "--imatrix")
        read(path)  # refused now, before any download, when it is not an importance matrix
        out["imatrix"] = {"sha256": digest, "name": path.name}
        files[digest] = path.resolve()
    return ({}, {}) if file_type in UNWEIGHTED_FILE_TYPES else (out, files)


#: What each flag's file may hold. Calibration texts people pass to llama-imatrix are a few MiB; 256 MiB is far more
#: text than an importance matrix is computed over. An importance matrix holds one float per input column per
#: expert: about 1 GiB for the largest MoE models (256 experts, 61 layers), so 4 GiB bounds every real one.
MAX_FILE = {"--calibration": 256 << 20, "--imatrix": 4 << 30}


def hash_given(path: Path, flag: str) -> str:
    """The sha256 of a file a flag names, once it is known to be a regular file of sane size (/dev/zero or a FIFO
    would be hashed forever)."""
    with open_input(path, flag, limit=MAX_FILE[flag], hint=_HINT) as f:
        h = hashlib.sha256()
        while chunk := f.read(4 << 20):
            h.update(chunk)
    return h.hexdigest()


def copy_given(source: Path, dest: Path, digest: str) -> None:
    """Copy a file the options name into the artifact, hashed on the way: it must be the bytes they were keyed by."""
    try:
        same = write_hashed(dest, file_chunks(source)) == digest
    except FileNotFoundError:
        same = False
    if not same:
        raise UsageError("the calibration text or importance matrix changed (or vanished) since the command started",
                         hint="run the command again")


if __name__ == "__main__":
    print(json.dumps(_child(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]), sys.argv[5])))
