"""The format `gguf`: one GGUF file per version, from safetensors, for llama.cpp, Ollama and llama-cpp-python.

`--to gguf:Q4_K_M` picks the file type. The conversion plans everything from config.json, the
tokenizer files and the safetensors headers first (an unsupported model fails before any output),
then streams: rows of one tensor at a time are read from the shards (pread), encoded on every
core, written in order and hashed on the way. The file is then re-opened with gguf's reader and,
when llama-cpp-python is installed, loaded by llama.cpp (see `converters.gguf_verify`).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from converters import ConversionRequest, ConversionResult, spec_of
from converters.gguf_file import HashingWriter, TensorInfo, header
from converters.gguf_mix import FILE_TYPES, MixParams, TensorChoice, choose_types
from converters.gguf_model import ModelPlan, SafetensorsReader, TensorPlan, UnsupportedModel, load_weights, plan_model
from converters.gguf_quants import Floats, backend, quantize, row_bytes
from converters.gguf_vocab import Vocab, load_vocab
from manifests import Format, GGUFRequirements, Verification
from registry.errors import UsageError
from registry.progress import NoProgress, Progress

DEFAULT_TYPE = "F16"
QUANTIZATION_VERSION = 2
#: Elements encoded per work item: small enough to keep memory flat, large enough to amortize numpy calls.
CHUNK_ELEMENTS = 1 << 20


@dataclass(frozen=True)
class EncodedTensor:
    """What was written for one tensor: its first and last bytes, and its encoding error on sampled rows."""

    info: TensorInfo
    choice: TensorChoice
    head: bytes
    tail: bytes
    rel_rmse: float
    max_abs_err: float


@dataclass(frozen=True)
class GGUFPlan:
    """Everything decided before the first byte: model, vocab, per-tensor types, header."""

    file_type: str
    model: ModelPlan
    vocab: Vocab
    choices: list[TensorChoice]
    infos: list[TensorInfo]
    metadata: list[tuple[str, Any]]


def _tensor_infos(model: ModelPlan, choices: list[TensorChoice]) -> list[TensorInfo]:
    return [TensorInfo(t.name, tuple(reversed(t.shape)), c.qtype, t.nrows * row_bytes(c.qtype, t.ncols))
            for t, c in zip(model.tensors, choices, strict=True)]


def plan(directory: Path, safetensors: list[Path], file_type: str, name: str) -> GGUFPlan:
    """Read config, tokenizer and safetensors headers; choose every tensor's type; no output yet."""
    return plans(directory, safetensors, [file_type], name)[0]


def plans(directory: Path, safetensors: list[Path], file_types: Sequence[str], name: str) -> list[GGUFPlan]:
    """One plan per type; config, headers and tokenizer are read once for all of them."""
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise UnsupportedModel("the snapshot has no config.json", hint="GGUF needs the model's config.json")
    if not safetensors:
        raise UnsupportedModel("the snapshot has no .safetensors weights",
                               hint="GGUF is converted from safetensors; pickle weights are not read")
    config = json.loads(config_path.read_text(encoding="utf-8"))
    model = plan_model(config, load_weights(safetensors), name)
    vocab = load_vocab(directory, model.vocab_size)
    is_70b = model.architecture in ("llama", "qwen2") and model.n_layer == 80
    shapes = [(t.name, t.shape) for t in model.tensors]
    mix = MixParams(model.n_layer, model.n_head, model.n_head_kv, is_70b)
    out = []
    for file_type in file_types:
        choices = choose_types(file_type, shapes, mix)
        metadata = [*model.metadata[:3], ("general.file_type", FILE_TYPES[file_type][1]),
                    ("general.quantization_version", QUANTIZATION_VERSION), *model.metadata[3:], *vocab.metadata()]
        out.append(GGUFPlan(file_type, model, vocab, choices, _tensor_infos(model, choices), metadata))
    return out


def _chunks(t: TensorPlan, reader: SafetensorsReader) -> Iterator[tuple[int, int]]:
    """Row ranges of one tensor, whole heads when they must be permuted together."""
    unit = reader.head_rows(t)
    rows = max(unit, CHUNK_ELEMENTS // max(1, t.ncols) // unit * unit)
    for start in range(0, t.nrows, rows):
        yield start, min(t.nrows, start + rows)


@dataclass
class _Stats:
    """Running figures of one tensor while its chunks are written."""

    err2: float = 0.0
    sig2: float = 0.0
    maxerr: float = 0.0
    head: bytes = b""
    tail: bytes = b""


Encoded = tuple[np.ndarray[Any, Any], float, float, float]


def _encode(rows: Floats, qtype: str) -> Encoded:
    """Encode rows; with the squared error, squared signal and max error of a few of them."""
    data = quantize(rows, qtype)
    err2 = sig2 = maxerr = 0.0
    if qtype != "F32":
        # A few rows per chunk, decoded by gguf's dequantizer: an implementation independent of ours.
        sample = rows[:: max(1, len(rows) // 4)][:4]
        back = dequantize(data[:: max(1, len(rows) // 4)][:4], qtype, rows.shape[1])
        diff = back - sample
        err2 = float(np.square(diff, dtype=np.float64).sum())
        sig2 = float(np.square(sample, dtype=np.float64).sum())
        maxerr = float(np.abs(diff).max(initial=0.0))
    return data, err2, sig2, maxerr


def _read_and_encode(reader: SafetensorsReader, t: TensorPlan, qtypes: list[str], start: int,
                     stop: int) -> list[Encoded]:
    """Rows [start, stop) read once, encoded once per distinct type (files sharing a type share the bytes)."""
    rows = reader.rows(t, start, stop)
    done: dict[str, Encoded] = {}
    for q in qtypes:
        if q not in done:
            done[q] = _encode(rows, q)
    return [done[q] for q in qtypes]


def dequantize(data: np.ndarray[Any, Any], qtype: str, ncols: int) -> Floats:
    """Decode rows with gguf's own numpy dequantizer."""
    import gguf

    out: Floats = gguf.quants.dequantize(data, gguf.GGMLQuantizationType[qtype]).reshape(-1, ncols)
    return out.astype(np.float32)


def _jobs(model: ModelPlan, reader: SafetensorsReader) -> Iterator[tuple[int, TensorPlan, int, int]]:
    for i, t in enumerate(model.tensors):
        for start, stop in _chunks(t, reader):
            yield i, t, start, stop


def write(planned: Sequence[GGUFPlan], dests: Sequence[Path], reader: SafetensorsReader, workers: int,
          progress: Progress | None = None) -> list[tuple[str, list[EncodedTensor]]]:
    """Stream one file per plan (same model, other types) from one read of the source.

    Each chunk of rows is read once, encoded in a pool for every plan, and written in order into
    every file, which is hashed on the way; the pool runs only a few chunks ahead of the writer.
    """
    progress = progress or NoProgress()
    stats = [[_Stats() for _ in p.infos] for p in planned]
    with contextlib.ExitStack() as stack:
        outs = [stack.enter_context(HashingWriter(d)) for d in dests]
        pool = stack.enter_context(ThreadPoolExecutor(max_workers=workers))
        for p, out in zip(planned, outs, strict=True):
            out.write(header(p.metadata, p.infos))
        current = 0
        pending: deque[tuple[int, Future[list[Encoded]]]] = deque()

        def drain(limit: int) -> None:
            nonlocal current
            while len(pending) > limit:
                i, fut = pending.popleft()
                while current < i:  # every tensor ends on an alignment boundary
                    for out in outs:
                        out.pad()
                    current += 1
                for out, st, (data, e, s, m) in zip(outs, stats, fut.result(), strict=True):
                    raw = np.ascontiguousarray(data).data.cast("B")
                    one = st[i]
                    one.head = one.head or bytes(raw[:64])
                    one.tail = bytes(raw[-64:])
                    one.err2, one.sig2, one.maxerr = one.err2 + e, one.sig2 + s, max(one.maxerr, m)
                    out.write(raw)
                    progress.advance(len(raw))

        model = planned[0].model
        qtypes = [[p.choices[i].qtype for p in planned] for i in range(len(model.tensors))]
        for i, t, start, stop in _jobs(model, reader):
            pending.append((i, pool.submit(_read_and_encode, reader, t, qtypes[i], start, stop)))
            drain(2 * workers)
        drain(0)
        while current < len(model.tensors):
            for out in outs:
                out.pad()
            current += 1
        digests = [out.close() for out in outs]
    return [(digest, [EncodedTensor(info, choice, st.head, st.tail, (st.err2 / st.sig2) ** 0.5 if st.sig2 else 0.0,
                                    st.maxerr)
                      for info, choice, st in zip(p.infos, p.choices, pstats, strict=True)])
            for digest, p, pstats in zip(digests, planned, stats, strict=True)]


class GGUFConverter:
    """Converts llama / mistral / qwen2 / qwen3 safetensors checkpoints to one GGUF file."""

    format: ClassVar[Format] = "gguf"
    name: ClassVar[str] = "mreg.gguf"
    version: ClassVar[str] = "1"

    def options(self, raw: dict[str, Any]) -> dict[str, Any]:
        """`{"spec": "Q4_K_M"}` -> `{"type": "Q4_K_M"}`; F16 when no type is given."""
        spec = (spec_of("gguf", raw, hint="use --to gguf:Q4_K_M") or DEFAULT_TYPE).upper()
        if spec not in FILE_TYPES:
            raise UsageError(f"unknown GGUF type {raw.get('spec')!r}",
                             hint=f"valid types: {', '.join(FILE_TYPES)}")
        return {"type": spec}

    def tool_versions(self) -> dict[str, str]:
        """numpy and gguf shape the bytes; llama-cpp-python and transformers the verification."""
        from importlib import metadata

        out = {"numpy": np.__version__}
        for dist in ("gguf", "llama-cpp-python", "transformers", "torch", "tokenizers"):
            try:
                out[dist] = metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        return out

    def convert(self, request: ConversionRequest) -> ConversionResult:
        """Plan, stream the GGUF file into the work directory, re-open and verify it."""
        return self.convert_many([request])[0]

    def convert_many(self, requests: Sequence[ConversionRequest]) -> list[ConversionResult]:
        """Several types of one source (same work directory) from one read of its tensors."""
        first = requests[0]
        with tempfile.TemporaryDirectory(prefix="mreg-gguf-") as tmp:
            return self._convert(requests, first.link_source(Path(tmp)))

    def _convert(self, requests: Sequence[ConversionRequest], directory: Path) -> list[ConversionResult]:
        from converters import gguf_verify

        first = requests[0]
        shards = sorted(p for p in directory.rglob("*.safetensors"))
        # The model's name in the store, so the engine's path is the same from one version to the next.
        base = first.name or first.source.repo.rstrip("/").split("/")[-1] or "model"
        types = [r.options["type"] for r in requests]  # distinct: registry.convert refuses a target given twice
        planned = plans(directory, shards, types, base)
        dests = [r.workdir / f"{base}-{t}.gguf" for r, t in zip(requests, types, strict=True)]
        reader = SafetensorsReader()
        size = sum(i.nbytes for p in planned for i in p.infos)
        first.progress.start(", ".join(d.name for d in dests), size)
        t0 = time.monotonic()
        try:
            written = write(planned, dests, reader, max(1, os.cpu_count() or 1), first.progress)
        finally:
            reader.close()
            first.progress.done()
        write_s = time.monotonic() - t0
        results = []
        # Several types of one source share the reference forward pass: the first file's check saves it.
        cache = directory / ".mreg-reference.npz" if len(planned) > 1 else None
        for p, dest, (digest, encoded) in zip(planned, dests, written, strict=True):
            t1 = time.monotonic()
            verification = gguf_verify.verify(dest, p, encoded, directory, first.source, cache)
            metrics = {**verification.metrics, "write_seconds": round(write_s, 3),
                       "verify_seconds": round(time.monotonic() - t1, 3)}
            if len(planned) > 1:
                metrics["files_written_together"] = float(len(planned))
            results.append(self._result(p, dest, digest, encoded, verification.model_copy(update={"metrics": metrics})))
        return results

    @staticmethod
    def _result(p: GGUFPlan, dest: Path, digest: str, encoded: list[EncodedTensor],
                verification: Verification) -> ConversionResult:
        counts = Counter(e.info.qtype for e in encoded)
        requirements = GGUFRequirements(
            architecture=p.model.architecture,
            quantization=p.file_type,
            tensor_types=dict(sorted(counts.items())),
            fallbacks={e.info.name: f"{e.choice.wanted}->{e.choice.qtype}: {e.choice.reason}"
                       for e in encoded if e.choice.wanted},
        )
        encoders = sorted({backend(c.qtype) for c in p.choices})
        return ConversionResult(
            verification=verification,
            known_digests={dest.name: digest},
            requirements=requirements,
            tool_versions={"gguf-encoders": "+".join(encoders)},
        )


CONVERTER = GGUFConverter()
