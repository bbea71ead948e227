"""The format `gguf`: one GGUF file per version, from safetensors, for llama.cpp, Ollama and llama-cpp-python.

`--to gguf:Q4_K_M` picks the file type; `--to gguf:auto` the smallest one that meets a quality budget
(`converters.gguf.auto`). The spec takes options after commas: `evaluation=default|FILE` and
`tokens=N` (the text quality is measured on, `converters.gguf.evaluation`: the shipped one for every
quantized type unless another is named), for auto a budget
(`kl=0.02`, `kl99=`, `top1=`, `ppl=`, the keys of `--require gguf:…`), and the importance matrix:
`calibration=FILE|default` and `calibration-ctx=N` (what `--calibration` folds in) first compute
one on the text (see `converters.gguf.imatrix`), store it beside the model as `<name>.imatrix.gguf`
and quantize with it; `imatrix=FILE` takes one made by llama-imatrix instead (stored as given). With auto,
the matrix is made once and every candidate, the 1- and 2-bit IQ types included, is quantized with it.
The conversion plans everything from config.json, the tokenizer files and the safetensors headers
first (an unsupported model fails before any output), then streams: rows of one tensor at a time
are read from the shards (pread), encoded on every core, written in order and hashed on the way.
The file is then re-opened with gguf's reader and, when llama-cpp-python is installed, loaded by
llama.cpp (see `converters.gguf.verify`), whose logits are compared with the float32 reference pass
started beside the write (`converters.gguf.overlap`); the file's fsync runs beside its verification.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import tempfile
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from converters.gguf import auto, heap, imatrix, overlap, quality
from converters.gguf import options as gguf_options
from converters.gguf.file import HashingWriter, direct_io, header, page_in, release
from converters.gguf.model import ModelPlan, SafetensorsReader, TensorPlan, check_architecture
from converters.gguf.naming import general_name, source_name
from converters.gguf.options import GGUFOptions
from converters.gguf.plan import EncodedTensor, GGUFPlan, needs_imatrix, plans
from converters.gguf.quants import Floats, backend, ggml_available, needs_ggml, nonfinite, quantize
from manifests import Artifact, GGUFImportance, GGUFRequirements, GGUFSelection, Manifest, Verification
from registry import atomic
from registry.convert.configs import check_configs
from registry.convert.protocol import (
    ConversionRequest,
    ConversionResult,
    Converter,
    ConverterBase,
    Options,
    Prepared,
    RawOptions,
    Session,
    TargetOptions,
    main_file,
)
from registry.errors import UsageError
from registry.progress import NoProgress, Progress

#: The reference forward pass's ids and logits, saved once for every file and candidate of one source.
REFERENCE_CACHE = ".mreg-reference.npz"
#: The chart of gguf:auto's trade-off, in the artifact's directory.
AUTO_CHART = "auto.svg"
#: Elements encoded per work item: small enough to keep memory flat, large enough to amortize numpy calls.
CHUNK_ELEMENTS = 1 << 20


def _chunks(t: TensorPlan, reader: SafetensorsReader) -> Iterator[tuple[int, int]]:
    """Row ranges of one tensor, whole heads when they must be permuted together."""
    unit = reader.head_rows(t)
    rows = max(unit, CHUNK_ELEMENTS // max(1, t.ncols) // unit * unit)
    for start in range(0, t.nrows, rows):
        yield start, min(t.nrows, start + rows)


class Encoded(NamedTuple):
    """One chunk encoded as one type: its bytes, sampled error figures, and NaN/Inf values in and out."""

    data: np.ndarray[Any, Any]
    err2: float
    sig2: float
    maxerr: float
    source_nonfinite: int
    encoded_nonfinite: int


@dataclass
class _Stats:
    """Running figures of one tensor while its chunks are written."""

    err2: float = 0.0
    sig2: float = 0.0
    maxerr: float = 0.0
    head: bytes = b""
    tail: bytes = b""
    source_nonfinite: int = 0
    encoded_nonfinite: int = 0

    def add(self, enc: Encoded) -> None:
        """Count one chunk in; NaN is kept (max() would drop it), so that the bound check sees it."""
        self.err2, self.sig2 = self.err2 + enc.err2, self.sig2 + enc.sig2
        self.maxerr = enc.maxerr if math.isnan(enc.maxerr) else max(self.maxerr, enc.maxerr)
        self.source_nonfinite += enc.source_nonfinite
        self.encoded_nonfinite += enc.encoded_nonfinite


def _encode(rows: Floats, qtype: str, source_nonfinite: int = 0, weights: Floats | None = None, start: int = 0,
            per: int = 0) -> Encoded:
    """Encode rows; with the squared error, squared signal and max error of a few of them, and the values of
    every row that decode to NaN or Inf (an F16 overflow, a Q8_0 scale past F16's range).

    `weights`: the importance matrix's (nmat, ncols) weights of the tensor; rows [start, ...) of a tensor of
    stacked experts (`per` rows each) take their own expert's row, as llama.cpp's quantizer hands them over."""
    if weights is None:
        data = quantize(rows, qtype)
    elif len(weights) == 1:
        data = quantize(rows, qtype, importance=weights[0])
    else:
        parts, at = [], 0
        while at < len(rows):
            e = (start + at) // per
            stop = min(len(rows), (e + 1) * per - start)
            parts.append(quantize(rows[at:stop], qtype, importance=weights[e]))
            at = stop
        data = np.concatenate(parts)
    err2 = sig2 = maxerr = 0.0
    if qtype != "F32":
        # A few rows per chunk, decoded by gguf's dequantizer: an implementation independent of ours.
        sample = rows[:: max(1, len(rows) // 4)][:4]
        with np.errstate(all="ignore"):  # non-finite rows are counted and fail verification; no warning on stderr
            back = dequantize(data[:: max(1, len(rows) // 4)][:4], qtype, rows.shape[1])
            diff = back - sample
        err2 = float(np.square(diff, dtype=np.float64).sum())
        sig2 = float(np.square(sample, dtype=np.float64).sum())
        maxerr = float(np.abs(diff).max(initial=0.0))
    return Encoded(data, err2, sig2, maxerr, source_nonfinite, nonfinite(data, qtype))


def _read_and_encode(reader: SafetensorsReader, t: TensorPlan, qtypes: list[str], start: int,
                     stop: int, weights: Sequence[Floats | None] = ()) -> list[Encoded]:
    """Rows [start, stop) read once, encoded once per distinct type and weighting (files sharing them share the
    bytes); `weights` per file: the tensor's importance-matrix weights, or None."""
    rows = reader.rows(t, start, stop)
    # Every source value is looked at: a NaN in a row no sample or prompt reaches would pass every other check.
    bad = rows.size - int(np.count_nonzero(np.isfinite(rows)))
    weights = list(weights) or [None] * len(qtypes)
    done: dict[tuple[str, bool], Encoded] = {}
    for q, w in zip(qtypes, weights, strict=True):
        if (q, w is not None) not in done:
            done[q, w is not None] = _encode(rows, q, bad, w, start, t.shape[-2] if len(t.shape) == 3 else 0)
    return [done[q, w is not None] for q, w in zip(qtypes, weights, strict=True)]


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
          progress: Progress | None = None, importance: Sequence[imatrix.Importance | None] = (), *,
          durable: bool = True, direct: bool | None = None) -> list[tuple[str, list[EncodedTensor]]]:
    """Stream one file per plan (same model, other types) from one read of the source.

    Each chunk of rows is read once, encoded in a pool for every plan, and written in order into
    every file, which is hashed on the way; the pool runs only a few chunks ahead of the writer.
    `importance`, per plan: the importance matrix to quantize with, or None. With `durable` False the
    files are not fsynced: the caller does it before they are used (beside their verification). `direct`:
    around the page cache or not (default: `converters.gguf.file.direct_io` of the files and the source).
    """
    progress = progress or NoProgress()
    stats = [[_Stats() for _ in p.infos] for p in planned]
    tensors = planned[0].model.tensors
    shards = {t.source.path for t in tensors if t.source is not None} | {q.path for t in tensors for q in t.parts}
    if direct is None:
        direct = direct_io(sum(i.nbytes for p in planned for i in p.infos), sum(s.stat().st_size for s in shards))
    with contextlib.ExitStack() as stack:
        outs = [stack.enter_context(HashingWriter(d, direct=direct)) for d in dests]
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
                for out, st, enc in zip(outs, stats, fut.result(), strict=True):
                    raw = np.ascontiguousarray(enc.data).data.cast("B")
                    one = st[i]
                    one.head = one.head or bytes(raw[:64])
                    one.tail = bytes(raw[-64:])
                    one.add(enc)
                    out.write(raw)
                    progress.advance(len(raw))

        model = planned[0].model
        qtypes = [[p.choices[i].qtype for p in planned] for i in range(len(model.tensors))]
        imps = list(importance) or [None] * len(planned)
        weights = [[_fitting(imp.weights(t.name), t) if imp is not None else None for imp in imps]
                   for t in model.tensors]
        for i, t, start, stop in _jobs(model, reader):
            pending.append((i, pool.submit(_read_and_encode, reader, t, qtypes[i], start, stop, weights[i])))
            drain(2 * workers)
        drain(0)
        while current < len(model.tensors):
            for out in outs:
                out.pad()
            current += 1
        digests = [out.close(durable=durable) for out in outs]
        if any(out.direct for out in outs):  # the verification reads the files next, in the source's place
            release(shards)
        for out in outs:
            if out.direct:
                page_in(out.path)
    return [(digest, [EncodedTensor(info, choice, st.head, st.tail, _rel_rmse(st), st.maxerr, st.source_nonfinite,
                                    st.encoded_nonfinite)
                      for info, choice, st in zip(p.infos, p.choices, pstats, strict=True)])
            for digest, p, pstats in zip(digests, planned, stats, strict=True)]


def _start_reference(directory: Path, cache: Path, evaluation: tuple[Path, int] | None) -> overlap.Ahead | None:
    """The float32 reference pass, started in a child beside the write where llama.cpp will compare against it."""
    import importlib.util

    if importlib.util.find_spec("llama_cpp") is None:  # no runtime check, so no reference to compare with
        return None
    return overlap.start(directory, cache, evaluation)


def _ahead_metrics(ahead: overlap.Ahead, metrics: dict[str, float]) -> dict[str, float]:
    """The reference pass's seconds when it ran beside the write (and the verification used its logits)."""
    seconds = overlap.finish(ahead)
    if seconds is None or "reference_seconds" in metrics:  # it failed, or the verification computed its own
        return {}
    return {"reference_seconds": seconds, "reference_overlapped": 1.0}


def _fitting(weights: Floats | None, t: TensorPlan) -> Floats | None:
    """An importance matrix's weights for a tensor when they fit it (one row per expert, one weight per column);
    llama.cpp ignores a token embedding's that do not (imatrix.check_fits refuses any other misfit first)."""
    nmat = t.shape[0] if len(t.shape) == 3 else 1
    return weights if weights is not None and weights.shape == (nmat, t.ncols) else None


def _rel_rmse(st: _Stats) -> float:
    """Relative RMS error of the sampled rows; NaN when they decoded to NaN or Inf, whatever their signal."""
    if not math.isfinite(st.err2):
        return math.nan
    return (st.err2 / st.sig2) ** 0.5 if st.sig2 else 0.0


def _needs_imatrix(file_type: str, tensor: str, qtype: str) -> UsageError:
    return UsageError(f"gguf:{file_type} needs an importance matrix: llama.cpp writes {tensor} as {qtype} only "
                      "with one",
                      hint="add --calibration FILE (or --calibration default), or --imatrix FILE from llama-imatrix")


def _refuse_unencodable(planned: Sequence[GGUFPlan], weighted: Sequence[bool]) -> None:
    """Before any byte: a tensor llama.cpp writes only with an importance matrix, or a type (or weighting) only
    llama.cpp's encoder writes where it is absent, is a usage error naming what to add."""
    for p, w in zip(planned, weighted, strict=True):
        needs = [c for c in p.choices if c.needs_imatrix]
        if needs and not w:
            raise _needs_imatrix(p.file_type, needs[0].name, needs[0].qtype)
        if not ggml_available():
            odd = sorted({c.qtype for c in p.choices if needs_ggml(c.qtype, w)})
            if odd:
                raise UsageError(f"gguf:{p.file_type}{' with an importance matrix' if w else ''} takes llama.cpp's "
                                 f"encoder ({', '.join(odd)}), and llama-cpp-python is not installed"
                                 f"{' or MREG_GGUF_QUANTIZER=numpy' if os.environ.get('MREG_GGUF_QUANTIZER') else ''}",
                                 hint="pip install 'mreg[gguf]' (llama-cpp-python), and unset MREG_GGUF_QUANTIZER")


class GGUFConverter(ConverterBase):
    """Converts llama / mistral / qwen2 / qwen3 safetensors checkpoints to one GGUF file."""

    format: ClassVar[str] = "gguf"
    converts_many: ClassVar[bool] = True
    name: ClassVar[str] = "mreg.gguf"
    #: Part of the conversion key: raised when what a conversion checks changes, so older results are made again.
    #: 2: NaN/Inf in the source, as written and in the logits fail; config sizes planned against the headers.
    #: 3: the weights' bytes are recorded (serving-memory plans); importance matrices (the calibration text's
    #: digest and chunking in the options), the IQ types.
    version: ClassVar[str] = "3"

    def parse(self, raw: RawOptions) -> GGUFOptions:
        """`{"spec": "Q4_K_M,calibration=FILE"}` -> typed options (see converters.gguf.options)."""
        return gguf_options.parse(raw)

    def prepare(self, options: TargetOptions) -> Prepared:
        """The type (or auto's budget and candidates), the evaluation text and the importance matrix, checked; the
        files they name hashed once (see converters.gguf.options)."""
        return gguf_options.prepare(options)

    def check_config(self, config: dict[str, Any], options: Options | None = None) -> None:
        """An architecture llama.cpp's converter and mreg's reference both know, and a type that needs no importance
        matrix unless one is given, before any download."""
        check_architecture(config)
        if options is not None and options["type"] != "auto" and not (
                options.get("calibration") or options.get("imatrix")):
            needs = needs_imatrix(config, options["type"])
            if needs is not None:
                raise _needs_imatrix(options["type"], *needs)

    def gate_problems(self, artifact: Artifact | None, requirement: str) -> list[str]:
        """`gguf`: a GGUF file; `gguf:quality`: its quality within its recorded budgets; `gguf:kl=X,top1=Y`: ours."""
        return quality.gate_problems(artifact, requirement)

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
        if len(requests) > 1 and any(r.options["type"] == "auto" for r in requests):
            raise UsageError("gguf:auto goes alone: its choice could be one of the other types asked for",
                             hint="convert gguf:auto in a command of its own (a version of its own)")
        heap.keep_freed_memory()  # every chunk's arrays reuse the last one's pages (converters.gguf.heap)
        # In the staging tree (the store's filesystem): a killed run leaves nothing outside the store; gc sweeps it.
        with tempfile.TemporaryDirectory(prefix=".gguf-src-", dir=first.workdir.parent) as tmp:
            directory = first.link_source(Path(tmp))
            if first.options["type"] == "auto":
                return [self._auto(first, directory)]
            return self._convert(requests, directory)

    def _convert(self, requests: Sequence[ConversionRequest], directory: Path) -> list[ConversionResult]:
        from converters.gguf import verify as gguf_verify

        first = requests[0]
        # Every config read below (by mreg and by gguf's vocabulary reader) is a JSON object, or nothing is done.
        check_configs({f.path: first.source_files(f.path) for f in first.source.files})
        shards = sorted(p for p in directory.rglob("*.safetensors"))
        # The model's name in the store, so the engine's path is the same from one version to the next.
        base = first.name or first.source.repo.rstrip("/").split("/")[-1] or "model"
        types = [r.options["type"] for r in requests]  # distinct: registry.convert.execute refuses a target given twice
        weighted = [bool(r.options.get("calibration") or r.options.get("imatrix")) for r in requests]
        # general.name is the model's own (llama.cpp applies rules by name), never the store's.
        planned = plans(directory, shards, types, general_name(directory, source_name(first.source)),
                        has_imatrix=weighted)
        _refuse_unencodable(planned, weighted)
        made = self._importance(requests, directory, base, planned[0])
        imps = [made[0] if w and made else None for w in weighted]
        if made:  # llama-quantize records the importance matrix in keys it appends
            planned = [replace(p, metadata=[*p.metadata, *made[1]]) if w else p
                       for p, w in zip(planned, weighted, strict=True)]
        dests = [r.workdir / f"{base}-{t}.gguf" for r, t in zip(requests, types, strict=True)]
        # Several types of one source share the reference forward pass, which starts beside the write.
        cache = directory / REFERENCE_CACHE
        ahead = _start_reference(directory, cache, gguf_verify.evaluation_text(planned[0],
                                                                                first.options.get("evaluation")))
        stack = contextlib.ExitStack()
        try:
            written, write_s = self._write(planned, dests, first.progress, imps)
            # The files' last bytes reach the disk while they are verified (the verification reads the page
            # cache); the registry gets them, and links them as blobs, only once they are there.
            syncs = stack.enter_context(ThreadPoolExecutor(max_workers=len(dests), thread_name_prefix="fsync"))
            durable = [syncs.submit(atomic.fsync_file, d) for d in dests]
            results: list[ConversionResult] = []
            for r, p, dest, (digest, encoded) in zip(requests, planned, dests, written, strict=True):
                t1 = time.monotonic()
                verification = gguf_verify.verify(dest, p, encoded, directory, first.source, cache,
                                                  r.options.get("evaluation"))
                metrics = {**verification.metrics, "write_seconds": round(write_s, 3),
                           "verify_seconds": round(time.monotonic() - t1, 3)}
                if ahead is not None and not results:
                    metrics |= _ahead_metrics(ahead, metrics)
                if len(planned) > 1:
                    metrics["files_written_together"] = float(len(planned))
                record = made[2] if made and weighted[len(results)] else None
                results.append(self._result(p, dest, digest, encoded,
                                            verification.model_copy(update={"metrics": metrics}), record))
            for d in durable:
                d.result()
        finally:
            if ahead is not None:
                overlap.stop(ahead)
            stack.close()
        if made:  # the importance matrix belongs to the first file made with it (each file is one artifact's)
            at = weighted.index(True)
            results[at].known_digests[made[2].file] = made[2].sha256
        return results

    @staticmethod
    def _write(planned: Sequence[GGUFPlan], dests: Sequence[Path], progress: Progress,
               imps: Sequence[imatrix.Importance | None]) -> tuple[list[tuple[str, list[EncodedTensor]]], float]:
        """Stream every file from one read of the source; what was written and the seconds it took."""
        reader = SafetensorsReader()
        progress.start(", ".join(d.name for d in dests), sum(i.nbytes for p in planned for i in p.infos))
        t0 = time.monotonic()
        try:
            written = write(planned, dests, reader, max(1, os.cpu_count() or 1), progress, imps, durable=False)
        finally:
            reader.close()
            progress.done()
        return written, time.monotonic() - t0

    def _auto(self, request: ConversionRequest, directory: Path) -> ConversionResult:
        """Plan every candidate, bisect them in size order (each tried one written and verified), keep the chosen."""
        import importlib.util

        from converters.gguf import chart
        from converters.gguf import verify as gguf_verify

        opts = request.options
        budget: dict[str, float] = dict(opts["budget"])
        check_configs({f.path: request.source_files(f.path) for f in request.source.files})
        if importlib.util.find_spec("llama_cpp") is None:
            raise UsageError("gguf:auto measures every candidate it tries with llama.cpp, which is not installed",
                             hint="pip install 'mreg[gguf]', or convert a named type (--to gguf:Q4_K_M)")
        shards = sorted(p for p in directory.rglob("*.safetensors"))
        base = request.name or request.source.repo.rstrip("/").split("/")[-1] or "model"
        types = list(opts["candidates"])
        weighted = [bool(opts.get("calibration") or opts.get("imatrix"))] * len(types)
        planned = plans(directory, shards, types, general_name(directory, source_name(request.source)),
                        has_imatrix=weighted)
        # Without a matrix, a candidate whose mix would need one on this model (a fallback row, say) is passed
        # over, never tried: the user named no type, so there is nothing to refuse.
        eligible = [i for i, p in enumerate(planned) if weighted[i] or not any(c.needs_imatrix for c in p.choices)]
        _refuse_unencodable([planned[i] for i in eligible], [weighted[i] for i in eligible])
        # One importance matrix for every candidate, made (or read) before the first is written.
        made = self._importance([request], directory, base, planned[0])
        if made:
            planned = [replace(p, metadata=[*p.metadata, *made[1]]) for p in planned]
        sizes = [sum(i.nbytes for i in p.infos) for p in planned]
        order = [i for i in auto.size_order(sizes) if i in eligible]
        cache = directory / REFERENCE_CACHE  # the reference forward pass, once for every candidate
        measured: dict[int, tuple[dict[str, float], int]] = {}
        kept: list[tuple[int, Path, str, list[EncodedTensor], Verification]] = []
        seconds = {"write_seconds": 0.0, "verify_seconds": 0.0}

        def meets(pos: int) -> bool:
            i = order[pos]
            p = planned[i]
            dest = request.workdir / f"{base}-{p.file_type}.gguf"
            reader = SafetensorsReader()
            request.progress.start(f"gguf:auto {dest.name} ({len(measured) + 1} tried)", sizes[i])
            t0 = time.monotonic()
            try:
                ((digest, encoded),) = write([p], [dest], reader, max(1, os.cpu_count() or 1), request.progress,
                                             [made[0]] if made else ())
            finally:
                reader.close()
                request.progress.done()
            t1 = time.monotonic()
            v = gguf_verify.verify(dest, p, encoded, directory, request.source, cache, opts["evaluation"])
            seconds["write_seconds"] += t1 - t0
            seconds["verify_seconds"] += time.monotonic() - t1
            if v.status == "failed":  # an integrity failure: the registry refuses the conversion with it
                raise _CandidateFailed(self._result(p, dest, digest, encoded, v, made[2] if made else None))
            auto.check_measured(p.file_type, v.metrics, budget, v.detail)
            measured[i] = (v.metrics, dest.stat().st_size)
            if quality.misses(v.metrics, budget):
                dest.unlink()
                return False
            for _, older, *_ in kept:  # a larger file that met the budget: this one is smaller
                older.unlink()
            kept[:] = [(i, dest, digest, encoded, v)]
            return True

        ahead = _start_reference(directory, cache, gguf_verify.evaluation_text(planned[0], opts["evaluation"]))
        try:
            found, tried = auto.bisect(len(order), meets)
        except _CandidateFailed as failed:
            return failed.result
        finally:
            if ahead is not None:
                overlap.stop(ahead)
        records = [auto.candidate(t, sizes[i], measured[i][1] if i in measured else None,
                                  measured[i][0] if i in measured else None, budget) for i, t in enumerate(types)]
        if found is None:
            raise auto.none_meets(records, budget)
        i, dest, digest, encoded, v = kept[0]
        (request.workdir / AUTO_CHART).write_text(
            chart.render(records, budget, types[i], f"{base}: gguf:auto chose {types[i]}"), encoding="utf-8")
        metrics = {**v.metrics, **{k: round(x, 3) for k, x in seconds.items()},
                   "auto_candidates": float(len(types)), "auto_tried": float(len(tried))}
        result = self._result(planned[i], dest, digest, encoded,
                              v.model_copy(update={"metrics": metrics, "budget": budget}), made[2] if made else None)
        if made:
            result.known_digests[made[2].file] = made[2].sha256
        selection = GGUFSelection(budget=budget, chosen=types[i], search=auto.SEARCH, tried=len(tried),
                                  candidates=tuple(records), chart=AUTO_CHART)
        assert isinstance(result.requirements, GGUFRequirements)
        return dataclasses.replace(result, requirements=result.requirements.model_copy(update={"selection": selection}))

    @staticmethod
    def _importance(requests: Sequence[ConversionRequest], directory: Path, base: str,
                    p: GGUFPlan) -> tuple[imatrix.Importance, list[tuple[str, Any]], GGUFImportance] | None:
        """The importance matrix the requests name (computed, or the given file copied in), read back and checked."""
        wanted = {json.dumps({k: r.options[k] for k in ("calibration", "imatrix") if k in r.options}, sort_keys=True)
                  for r in requests if r.options.get("calibration") or r.options.get("imatrix")}
        if not wanted:
            return None
        if len(wanted) > 1:
            raise UsageError("the GGUF targets of one conversion name different importance matrices",
                             hint="give --calibration or --imatrix once; it applies to every gguf target")
        chosen = json.loads(wanted.pop())
        workdir = requests[0].workdir
        t0 = time.monotonic()
        given = requests[0].files
        if "calibration" in chosen:
            cal = chosen["calibration"]
            dest = workdir / f"{base}.imatrix.gguf"
            text = directory / ".mreg-calibration.txt"  # the bytes the key names, whatever the file becomes
            imatrix.copy_given(given[cal["sha256"]], text, cal["sha256"])
            progress = requests[0].progress
            progress.start(f"importance matrix on {cal['name']}", None, unit="step")
            computed = imatrix.compute(directory, text, dest, cal["chunk_size"], cal["name"])
            progress.done()
            imp = imatrix.read(dest)
            record = GGUFImportance(file=dest.name, sha256=computed.sha256, made_by="mreg", dataset=cal["name"],
                                    dataset_sha256=cal["sha256"], tokens=computed.tokens, chunks=computed.chunks,
                                    chunk_size=cal["chunk_size"], entries=len(imp.sums),
                                    seconds=round(time.monotonic() - t0, 3))
        else:
            digest = chosen["imatrix"]["sha256"]
            source = given[digest]
            with open(source, "rb") as f:
                gguf_format = f.read(4) == b"GGUF"
            dest = workdir / (f"{base}.imatrix.gguf" if gguf_format else f"{base}.imatrix.dat")
            imatrix.copy_given(source, dest, digest)
            imp = imatrix.read(dest)
            record = GGUFImportance(file=dest.name, sha256=digest, made_by="given",
                                    dataset=imp.datasets[0] if imp.datasets else None, chunks=imp.chunk_count,
                                    chunk_size=imp.chunk_size, entries=len(imp.sums), seconds=0.0)
        imatrix.check_fits(imp, p.model, record.file)
        info: list[tuple[str, Any]] = [("quantize.imatrix.file", record.file)]
        if record.dataset:
            info.append(("quantize.imatrix.dataset", record.dataset))
        info.append(("quantize.imatrix.entries_count", len(imp.sums)))
        if imp.chunk_count > 0:
            info.append(("quantize.imatrix.chunks_count", imp.chunk_count))
        return imp, info, record

    @staticmethod
    def _result(p: GGUFPlan, dest: Path, digest: str, encoded: list[EncodedTensor],
                verification: Verification, importance: GGUFImportance | None = None) -> ConversionResult:
        counts = Counter(e.info.qtype for e in encoded)
        requirements = GGUFRequirements(
            architecture=p.model.architecture,
            quantization=p.file_type,
            tensor_types=dict(sorted(counts.items())),
            fallbacks={e.info.name: f"{e.choice.wanted}->{e.choice.qtype}: {e.choice.reason}"
                       for e in encoded if e.choice.wanted},
            imatrix=importance,
        )
        encoders = sorted({backend(c.qtype) for c in p.choices})
        return ConversionResult(
            verification=verification,
            known_digests={dest.name: digest},
            requirements=requirements,
            tool_versions={"gguf-encoders": "+".join(encoders)},
            weights_bytes=sum(i.nbytes for i in p.infos),
        )

    def mount_file(self, artifact: Artifact) -> str:
        """The .gguf file."""
        return main_file(artifact, ".gguf")

    def open_session(self, artifact_dir: Path, artifact: Artifact, manifest: Manifest) -> Session:
        """llama.cpp through llama-cpp-python."""
        from converters.gguf.runtime import open_session

        return open_session(artifact_dir, artifact, manifest)


class _CandidateFailed(Exception):
    """A candidate of gguf:auto failed its integrity checks: the search stops with its result."""

    def __init__(self, result: ConversionResult) -> None:
        super().__init__(result.verification.detail)
        self.result = result


#: What `registry.convert.formats` loads; the annotation has mypy check the class against the protocol.
CONVERTER: Converter = GGUFConverter()
