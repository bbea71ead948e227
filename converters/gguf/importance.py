"""The importance matrix one GGUF conversion quantizes with: computed on the calibration text, or the file given
copied in; read back, checked against the model, and the metadata keys llama-quantize appends for it.

The options name the text or file by digest (`converters.gguf.options`); the file itself comes beside them
(`ConversionRequest.files`) and is copied, hashed on the way, before it is used: what is used is what was keyed.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from converters.gguf import imatrix
from converters.gguf.plan import GGUFPlan
from manifests import GGUFImportance
from registry.convert.protocol import ConversionRequest
from registry.errors import UsageError


class Made(NamedTuple):
    """An importance matrix in the artifact's directory: its weights, its metadata keys, its record."""

    importance: imatrix.Importance
    info: list[tuple[str, Any]]
    record: GGUFImportance


def importance_for(requests: Sequence[ConversionRequest], directory: Path, base: str, p: GGUFPlan) -> Made | None:
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
    given = requests[0].files
    t0 = time.monotonic()
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
    return Made(imp, info, record)
