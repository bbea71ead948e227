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

Here: the converter and the conversion of named types. Beside it: the options (`options`), what every
conversion prepares once (`work`), the importance matrix (`importance`), the streaming write (`stream`)
and gguf:auto's search (`auto`).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from converters.gguf import auto, heap, imatrix, overlap, quality
from converters.gguf import options as gguf_options
from converters.gguf.model import SafetensorsReader, check_architecture
from converters.gguf.options import GGUFOptions
from converters.gguf.plan import EncodedTensor, GGUFPlan
from converters.gguf.plan import needs_imatrix as needs_for
from converters.gguf.stream import write
from converters.gguf.work import Work, ahead_metrics, imatrix_refusal, is_weighted, prepare, result
from manifests import Artifact, Manifest
from registry import atomic
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
from registry.progress import Progress


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
        if options is not None and options["type"] != "auto" and not is_weighted(options):
            needs = needs_for(config, options["type"])
            if needs is not None:
                raise imatrix_refusal(options["type"], *needs)

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
        # Every chunk's arrays reuse the last one's pages (converters.gguf.heap), for this conversion only.
        # In the staging tree (the store's filesystem): a killed run leaves nothing outside the store; gc sweeps it.
        with heap.freed_memory_kept(), \
                tempfile.TemporaryDirectory(prefix=".gguf-src-", dir=first.workdir.parent) as tmp:
            directory = first.link_source(Path(tmp))
            if first.options["type"] == "auto":
                if importlib.util.find_spec("llama_cpp") is None:
                    raise UsageError("gguf:auto measures every candidate it tries with llama.cpp, which is not "
                                     "installed", hint="pip install 'mreg[gguf]', or convert a named type "
                                                       "(--to gguf:Q4_K_M)")
                types = list(first.options["candidates"])
                weighted = [is_weighted(first.options)] * len(types)
                # Without a matrix, a candidate whose mix would need one on this model (a fallback row, say) is
                # passed over, never tried: the user named no type, so there is nothing to refuse.
                return [auto.search(first, prepare([first], directory, types, weighted, pass_over=True))]
            # Types are distinct: registry.convert.plan refuses a target given twice.
            return self._convert(requests, prepare(requests, directory, [r.options["type"] for r in requests],
                                                   [is_weighted(r.options) for r in requests]))

    def _convert(self, requests: Sequence[ConversionRequest], work: Work) -> list[ConversionResult]:
        """Stream every named type from one read of the source, then verify each file beside its fsync."""
        from converters.gguf import verify as gguf_verify

        first, planned, made, weighted = requests[0], work.planned, work.made, work.weighted
        imps = [made.importance if w and made else None for w in weighted]
        dests = [r.workdir / f"{work.base}-{r.options['type']}.gguf" for r in requests]
        # Several types of one source share the reference forward pass, which starts beside the write.
        ahead = work.start_reference(gguf_verify.evaluation_text(planned[0], first.options.get("evaluation")))
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
                verification = gguf_verify.verify(dest, p, encoded, work.directory, first.source, work.reference,
                                                  r.options.get("evaluation"))
                metrics = {**verification.metrics, "write_seconds": round(write_s, 3),
                           "verify_seconds": round(time.monotonic() - t1, 3)}
                if ahead is not None and not results:
                    metrics |= ahead_metrics(ahead, metrics)
                if len(planned) > 1:
                    metrics["files_written_together"] = float(len(planned))
                record = made.record if made and weighted[len(results)] else None
                results.append(result(p, dest, digest, encoded,
                                      verification.model_copy(update={"metrics": metrics}), record))
            for d in durable:
                d.result()
        finally:
            if ahead is not None:
                overlap.stop(ahead)
            stack.close()
        if made:  # the importance matrix belongs to the first file made with it (each file is one artifact's)
            results[weighted.index(True)].known_digests[made.record.file] = made.record.sha256
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

    def mount_file(self, artifact: Artifact) -> str:
        """The .gguf file."""
        return main_file(artifact, ".gguf")

    def open_session(self, artifact_dir: Path, artifact: Artifact, manifest: Manifest) -> Session:
        """llama.cpp through llama-cpp-python."""
        from converters.gguf.runtime import open_session

        return open_session(artifact_dir, artifact, manifest)


#: What `registry.convert.formats` loads; the annotation has mypy check the class against the protocol.
CONVERTER: Converter = GGUFConverter()
