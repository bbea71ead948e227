"""The format `onnx`: encoders (last_hidden_state) and decoder LLMs (logits, optionally with a KV cache).

`--to onnx[:SPEC]`, SPEC being comma-separated tokens, in any order, each at most once:

    fp32 | fp16      precision of weights and compute (fp32 when absent)
    int8             ONNX Runtime dynamic quantization of MatMul weights (from fp32; not with fp16)
    optimize         ONNX Runtime offline graph optimization (extended level, for the CPU provider)
    with-past        decoders: past key/value inputs and present outputs, to generate with a KV cache
    torchscript | dynamo
                     the exporter (torchscript when absent): TorchScript traces the example's Python
                     branches, and the verification (several shapes, padding, generation through the
                     KV cache) vouches for the graph; dynamo (torch.export) proves it for every shape
                     in its dynamic range, at about 5x the export time (see the README)

e.g. `--to onnx`, `--to onnx:fp16,with-past`, `--to onnx:int8,optimize`. The normalized options
(`{"dtype", "quantize", "optimize", "with_past", "exporter"}`) are part of the conversion key and recorded.
The tree is `model.onnx` + `model.onnx.data` (weights, always external), plus the source's config
and tokenizer files, hard-linked, so that ONNX Runtime, Optimum and Triton load it as it is.
torch, transformers, onnx and onnxruntime are imported only when a conversion runs: `mreg[onnx]`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

from manifests import Artifact, Manifest
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
    spec_of,
    stage,
)
from registry.errors import UsageError
from registry.progress import Progress

#: Modules the conversion needs, and the distributions that provide each (ONNX Runtime comes in two builds).
REQUIRED: dict[str, tuple[str, ...]] = {
    "torch": ("torch",), "transformers": ("transformers",), "onnx": ("onnx",),
    "onnxruntime": ("onnxruntime", "onnxruntime-gpu"), "onnxscript": ("onnxscript",), "numpy": ("numpy",),
}
#: Files of the source that travel with the graph: what a runtime needs to tokenize and generate.
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt", "tokenizer.model",
              "added_tokens.json", "chat_template.jinja")
PROVIDER = "CPUExecutionProvider"
_TOKENS: dict[str, tuple[str, Any]] = {
    "fp32": ("dtype", "fp32"),
    "fp16": ("dtype", "fp16"),
    "int8": ("quantize", "int8"),
    "optimize": ("optimize", True),
    "with-past": ("with_past", True),
    "dynamo": ("exporter", "dynamo"),
    "torchscript": ("exporter", "torchscript"),
}
GRAMMAR = "comma-separated: fp32|fp16, int8, optimize, with-past, torchscript|dynamo (e.g. --to onnx:fp16,with-past)"


def _stage(progress: Progress, name: str) -> contextlib.AbstractContextManager[None]:
    return stage(progress, "ONNX", name)


class MissingDependency(UsageError):
    """A library the ONNX converter needs is not installed."""

    def __init__(self, missing: list[str]) -> None:
        super().__init__(f"--to onnx needs {', '.join(missing)}, which {'is' if len(missing) == 1 else 'are'} "
                         "not installed", hint="pip install 'mreg[onnx]'")
        self.missing = missing


def parse_spec(spec: str) -> Options:
    """`"fp16,with-past"` -> the normalized options; unknown, repeated or contradictory tokens are refused."""
    options: dict[str, Any] = {"dtype": "fp32", "quantize": None, "optimize": False, "with_past": False,
                               "exporter": "torchscript"}
    seen: set[str] = set()
    for raw in spec.split(","):
        token = raw.strip().lower()
        if not token:
            continue
        if token not in _TOKENS:
            raise UsageError(f"unknown --to onnx option {raw.strip()!r}", hint=GRAMMAR)
        key, value = _TOKENS[token]
        if key in seen:
            raise UsageError(f"--to onnx:{spec} sets {key} twice", hint=GRAMMAR)
        seen.add(key)
        options[key] = value
    if options["quantize"] == "int8" and options["dtype"] == "fp16":
        raise UsageError("int8 quantizes from fp32 weights: it cannot be combined with fp16", hint=GRAMMAR)
    return options


@dataclass(frozen=True)
class ONNXOptions:
    """`--to onnx:fp16,with-past` typed (what `parse_spec` reads)."""

    format: ClassVar[str] = "onnx"
    dtype: str = "fp32"
    quantize: str | None = None
    optimize: bool = False
    with_past: bool = False
    exporter: str = "torchscript"


def precision(options: Options) -> str:
    """The precision whose verification thresholds apply: int8, fp16 or fp32."""
    return "int8" if options["quantize"] == "int8" else str(options["dtype"])


def _require() -> None:
    """Say how to install what is missing, before any work; modules are imported where used.

    (Finding rather than importing them spares the TorchScript path onnxscript's 0.5 s import.)
    """
    import importlib.util

    missing = [module for module in REQUIRED if importlib.util.find_spec(module) is None]
    if missing:
        raise MissingDependency(missing)


class ONNXConverter(ConverterBase):
    """Exports with torch.onnx (TorchScript, or dynamo on request), transforms, verifies in ONNX Runtime."""

    format: ClassVar[str] = "onnx"
    name: ClassVar[str] = "mreg.onnx"
    #: 2: the dynamo graph is cleaned by mreg's pass list instead of onnxscript's rewriter; `exporter` option.
    #: 3: TorchScript is the default exporter; every graph is stamped IR 10 (TorchScript writes IR 8).
    #: 4: NaN/Inf in any source tensor, a written initializer or PyTorch's outputs fail verification.
    #: 5: fp16 is exported from a float16 model (no onnxruntime float16 conversion); one full past for every layer.
    version: ClassVar[str] = "5"

    def parse(self, raw: RawOptions) -> ONNXOptions:
        """`{"spec": "fp16,with-past"}` -> `ONNXOptions(dtype="fp16", with_past=True)`."""
        return ONNXOptions(**parse_spec(spec_of("onnx", raw, GRAMMAR)))

    def prepare(self, options: TargetOptions) -> Prepared:
        """`{"dtype": "fp16", "quantize": None, "optimize": False, ...}`: the options as recorded."""
        assert isinstance(options, ONNXOptions)
        return Prepared(self.format, asdict(options))

    def check_config(self, config: dict[str, Any], options: Options | None = None) -> None:
        """A model type the exporter covers (encoder or causal decoder), before any download."""
        try:
            from converters.onnx.export import classify
        except ImportError:  # no exporter installed: the conversion itself says what to install
            return
        classify(config)

    def tool_versions(self) -> dict[str, str]:
        """The libraries whose output the artifact depends on, and the format versions it is written in."""
        from importlib import metadata

        from converters.onnx.export import OPSET
        from converters.onnx.graph import IR_VERSION

        out = {"onnx.opset": str(OPSET), "onnx.ir_version": str(IR_VERSION), "onnxruntime.provider": PROVIDER}
        missing = []
        for module, dists in REQUIRED.items():
            for dist in dists:
                try:
                    version = metadata.version(dist)
                except metadata.PackageNotFoundError:
                    continue
                out[module] = version if dist == module else f"{version} ({dist})"
                break
            else:
                missing.append(module)
        if missing:
            raise MissingDependency(missing)
        return out

    def convert(self, request: ConversionRequest) -> ConversionResult:
        """Export, transform as the spec says, verify the written files against PyTorch, add the side files."""
        _require()
        with tempfile.TemporaryDirectory(prefix=".onnx-src-", dir=request.workdir.parent) as src, \
                tempfile.TemporaryDirectory(prefix=".onnx-", dir=request.workdir.parent) as tmp, \
                _fewer_collections() as freeze:
            return self._convert(request, request.link_source(Path(src)), Path(tmp), freeze)

    def _convert(self, request: ConversionRequest, directory: Path, tmp: Path,
                 freeze: Callable[[], None]) -> ConversionResult:
        from converters.hf import weights
        from converters.onnx import export as ex
        from converters.onnx import graph as files
        from converters.onnx import memory, upcast
        from converters.onnx import verify as onnx_verify
        from registry.convert.configs import check_configs, check_sizes
        from registry.convert.safetensors import read_header

        opts = request.options
        # transformers follows the shard index: it must name the snapshot's own shards and agree with them.
        sources = {f.path: request.source_files(f.path) for f in request.source.files}
        check_configs(sources, request.configs_read)
        # transformers builds every layer the config names before it reads a weight.
        check_sizes(sources, request.configs_read)
        config = request.config if request.config is not None else ex.read_config(directory)
        task = ex.classify(config)
        if opts["with_past"] and task != "text-generation":
            raise ex.UnsupportedModel("with-past applies to decoder LLMs only", hint="drop with-past for an encoder")
        progress = request.progress
        half = opts["dtype"] == "fp16"  # loaded, traced and written in float16: no float32 copy at any point
        tensors = {f.path: request.source_files(f.path) for f in request.source.files
                   if f.path.endswith(".safetensors")}
        budget = memory.plan([read_header(p, label) for label, p in tensors.items()], half,
                             weightless=opts["exporter"] == "torchscript")
        if not budget.fits:  # refused before a byte of weights is loaded: an OOM kill would leave nothing to report
            raise memory.InsufficientMemory(budget, f"onnx:{'fp16' if half else precision(opts)}")
        with _stage(progress, "loading the model"):
            # Every source value, not only those the probes reach (an unused embedding row, say).
            source = weights.scan(tensors)
            model, tokenizer = ex.load(directory, task, half, config)
            rounded = upcast.nonfinite(model) if half else {}
            sig = ex.signature(model, tokenizer, task, opts["with_past"])
            probe = onnx_verify.probes(model, tokenizer, sig)
        freeze()  # torch's, transformers' and the model's objects live to the end: collections skip them
        # Each transform reads the previous stage's directory; the last stage writes into the artifact tree.
        transforms: list[tuple[str, Callable[[Path, Path], object]]] = []
        if opts["quantize"] == "int8":
            transforms.append(("int8 quantization", files.quantize_int8))
        if opts["optimize"]:
            transforms.append(("optimization", lambda src, dest: files.optimize(src, dest, PROVIDER)))
        outputs = [tmp / str(i) for i in range(len(transforms))] + [request.workdir]
        # In float16 the reference swaps each module's weights for float32 copies while it runs: not beside a trace.
        beside = opts["exporter"] == "torchscript" and not half
        with _pytorch_reference(model, sig, probe, progress, beside) as reference:
            with _stage(progress, "export"):
                ex.export(model, sig, outputs[0], opts["exporter"])
            if half:  # the reference ran first: nothing reads the weights again
                ex.release(model)
            del model  # the weights are freed once the reference is done with them (at once when it ran first)
            for i, (step, run) in enumerate(transforms):
                with _stage(progress, step):
                    run(outputs[i], outputs[i + 1])
            versions = self.tool_versions()
            with _stage(progress, "verification in ONNX Runtime"):
                runs = {PROVIDER: onnx_verify.run(onnx_verify.session(request.workdir, PROVIDER, half), sig, probe)}
                gpu, why_not = onnx_verify.gpu_session(request.workdir)
                if gpu is not None:
                    runs[onnx_verify.GPU_PROVIDER] = onnx_verify.run(gpu, sig, probe)
                    del gpu
                nonfinite = {"source tensor": source.nonfinite, "float16 weight": rounded,
                             "written initializer": files.nan_initializers(request.workdir)}
                verification = onnx_verify.verify(runs, reference(), probe, sig, precision(opts), request.source,
                                                  versions, why_not, nonfinite)
        known = {}
        present = {f.path: f for f in request.source.files}
        for name in SIDE_FILES:
            if name in present:
                known[name] = request.place(request.source_files(name), name, present[name].sha256)
        graph = files.describe(request.workdir / files.MODEL_FILE)
        extra = {"onnx.ir_version": str(graph["ir_version"]),
                 "onnx.opsets": ",".join(f"{d}={v}" for d, v in sorted(graph["opsets"].items()))}
        return ConversionResult(verification=verification, known_digests=known, tool_versions=extra,
                                weights_bytes=int(graph["initializer_bytes"]))

    def mount_file(self, artifact: Artifact) -> str:
        """model.onnx (its external data file sits beside it)."""
        return main_file(artifact, "model.onnx")

    def open_session(self, artifact_dir: Path, artifact: Artifact, manifest: Manifest) -> Session:
        """ONNX Runtime, with the source's tokenizer."""
        from converters.onnx.runtime import open_session

        return open_session(artifact_dir, artifact, manifest)


@contextlib.contextmanager
def _fewer_collections() -> Iterator[Callable[[], None]]:
    """Python's cyclic collector, run less often for the conversion's duration, then as it was.

    Importing torch and transformers and tracing a model allocate millions of objects, and every
    700 allocations the collector ran (a 100 M llama: 0.3-0.4 s of 10 s; frozen objects and a
    larger first generation take that to almost nothing, with the same peak memory). Tensors are
    freed by reference counting either way. The block calls the function it is given once what it
    loaded should be frozen.
    """
    threshold, ours, froze = gc.get_threshold(), gc.get_freeze_count() == 0, False

    def freeze() -> None:
        nonlocal froze
        if ours:  # a host process's own frozen set is left as it is
            # Collected first: what loading leaves in reference cycles would never be freed once frozen (measured:
            # a float16 1.5 B model's conversion held 6.2 GB through its reference without this collection, 3.3
            # with it).
            gc.collect()
            gc.freeze()
            froze = True

    gc.set_threshold(20_000, 20, 20)
    try:
        yield freeze
    finally:
        if froze:
            gc.unfreeze()
        gc.set_threshold(*threshold)


@contextlib.contextmanager
def _pytorch_reference(model: Any, sig: Any, probe: Any, progress: Progress,
                       beside: bool) -> Iterator[Callable[[], Any]]:
    """PyTorch's outputs on the probes, for the block to read through the function it is given.

    `beside`: computed in a second thread while the block exports, transforms and runs ONNX Runtime.
    The TorchScript tracer's state is per thread (transformers checks it through torch.jit.is_tracing),
    so the untraced model runs there while the main thread traces, reading the same weights, with
    one core fewer for PyTorch's kernels (the tracer's). The thread touches no process-wide state:
    the quiet() around the block covers its output. If the block fails (or is interrupted), the
    error is not held until the reference is done: the thread is left to finish on its own.
    Otherwise (dynamo's export patches process-wide state) they are computed first, before the block.
    """
    import torch

    from converters.hf.quiet import quiet
    from converters.onnx import verify as onnx_verify

    if not beside:
        with _stage(progress, "PyTorch reference"), quiet():
            ref = onnx_verify.reference(model, sig, probe)
        del model  # the caller's reference is then the last one
        yield lambda: ref
        return
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, threads - 1))
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mreg-reference")
    try:
        with quiet():
            pending = pool.submit(onnx_verify.reference, model, sig, probe)
            del model  # the thread holds it until the reference is computed
            yield pending.result
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        torch.set_num_threads(threads)


#: What `registry.convert.formats` loads; the annotation has mypy check the class against the protocol.
CONVERTER: Converter = ONNXConverter()
