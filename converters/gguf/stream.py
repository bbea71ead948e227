"""Streaming GGUF files from safetensors: each chunk of rows read once, encoded on every core, written in order.

One read of the source makes several files (one per type asked for, same model): every chunk is encoded once
per distinct type and weighting and written into each file, which is hashed on the way; the pool runs only a
few chunks ahead of the writer, so memory stays flat whatever the model's size.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from converters.gguf import imatrix
from converters.gguf.file import HashingWriter, direct_io, header, page_in, release
from converters.gguf.model import ModelPlan, SafetensorsReader, TensorPlan
from converters.gguf.plan import EncodedTensor, GGUFPlan
from converters.gguf.quants import Floats, backend, nonfinite, quantize
from registry.progress import NoProgress, Progress

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
                                    st.encoded_nonfinite, backend(choice.qtype, w[k] is not None))
                      for info, choice, st, w in zip(p.infos, p.choices, pstats, weights, strict=True)])
            for k, (digest, p, pstats) in enumerate(zip(digests, planned, stats, strict=True))]



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

