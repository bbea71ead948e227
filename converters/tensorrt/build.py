"""Building engines: shape profiles from the ONNX graph, the reduced-precision graph, one build per target.

Both backends share this path; only `_backend()` and the few lines marked "tensorrt only" differ.
TensorRT for RTX builds ahead of time for a chosen compute capability without a GPU; TensorRT builds
on (and for) the local GPU. Both build strongly typed networks: precision is the graph's, so fp16
means converting the ONNX graph first (fp32 inputs and outputs kept), never a builder flag.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from converters.tensorrt.binding import Gpu
from registry import atomic
from registry.errors import MregError, UsageError

Profile = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
#: Default profile ranges for dynamic axes: batch 1..8 (opt 1), sequences 1..min(512, context) (opt 128).
DEFAULT_BATCH = (1, 1, 8)
DEFAULT_MAX_SEQUENCE = 512
DEFAULT_OPT_SEQUENCE = 128
#: Distribution names that carry each backend's module, newest CUDA first; the suffix is the CUDA flavour.
DISTRIBUTIONS = {"tensorrt-rtx": ("tensorrt_rtx_cu13", "tensorrt_rtx_cu12", "tensorrt_rtx"),
                 "tensorrt": ("tensorrt_cu13", "tensorrt_cu12", "tensorrt")}
MODULES = {"tensorrt-rtx": "tensorrt_rtx", "tensorrt": "tensorrt"}
HARDWARE_LEVELS = {"none": "NONE", "ampere+": "AMPERE_PLUS", "same-cc": "SAME_COMPUTE_CAPABILITY"}


class BuildFailed(MregError):
    """The ONNX parser or the builder refused the graph."""


class MissingBackend(UsageError):
    """The TensorRT package of the chosen backend is not installed."""

    def __init__(self, backend: str) -> None:
        pkg = "tensorrt-rtx-cu13" if backend == "tensorrt-rtx" else "tensorrt"
        super().__init__(f"backend={backend} needs the {pkg} package, which is not installed",
                         hint="pip install 'mreg[onnx,tensorrt]'" if backend == "tensorrt-rtx" else
                         "install TensorRT for your CUDA on the GPU machine (pip install tensorrt-cu12)")


def installed(backend: str) -> tuple[str, str | None] | None:
    """(version, CUDA major) of the installed backend package, or None; reads metadata, imports nothing."""
    for dist in DISTRIBUTIONS[backend]:
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        cuda = dist.rsplit("_cu", 1)[1] if "_cu" in dist else None
        return version, cuda
    return None


def _backend(backend: str) -> Any:
    """The backend's module, imported now."""
    import importlib

    try:
        return importlib.import_module(MODULES[backend])
    except ImportError as e:
        raise MissingBackend(backend) from e


def default_profiles(graph: dict[str, Any], config: dict[str, Any]) -> dict[str, Profile]:
    """min/opt/max per input from its dims: fixed dims as they are, batch 1..8, sequences 1..min(512, context)."""
    context = int(config.get("max_position_embeddings") or DEFAULT_MAX_SEQUENCE)
    longest = max(1, min(DEFAULT_MAX_SEQUENCE, context))
    seq = (1, min(DEFAULT_OPT_SEQUENCE, longest), longest)
    out: dict[str, Profile] = {}
    for name, spec in graph["inputs"].items():
        dims: list[tuple[int, int, int]] = []
        for i, d in enumerate(spec["shape"]):
            if isinstance(d, int) and d > 0:
                dims.append((d, d, d))
            elif "batch" in str(d).lower() or (i == 0 and not str(d)):
                dims.append(DEFAULT_BATCH)
            else:
                dims.append(seq)
        out[name] = (tuple(x[0] for x in dims), tuple(x[1] for x in dims), tuple(x[2] for x in dims))
    return out


def profiles_for(graph: dict[str, Any], config: dict[str, Any], given: dict[str, Any]) -> dict[str, Profile]:
    """The defaults, with the spec's `shapes=` for the inputs it names; refuses unknown inputs and wrong ranks."""
    profiles = default_profiles(graph, config)
    for name, (lo, opt, hi) in given.items():
        if name not in profiles:
            raise UsageError(f"shapes= names {name!r}, which is not an input of the ONNX graph",
                             hint=f"its inputs: {', '.join(profiles)}")
        rank = len(profiles[name][0])
        if any(len(s) != rank for s in (lo, opt, hi)):
            raise UsageError(f"shapes= gives {name} a rank other than its {rank}",
                             hint=f"e.g. {name}={'x'.join(['1'] * rank)}:…")
        fixed = graph["inputs"][name]["shape"]
        for i, d in enumerate(fixed):
            if isinstance(d, int) and d > 0 and not lo[i] == opt[i] == hi[i] == d:
                raise UsageError(f"shapes= changes fixed dimension {i} of {name} (it is {d})")
        profiles[name] = (tuple(lo), tuple(opt), tuple(hi))
    return profiles


def describe(onnx_dir: Path) -> dict[str, Any]:
    """Inputs (names, dims), float initializer types of the ONNX artifact, without its weights."""
    import onnx

    proto = onnx.load_model(onnx_dir / MODEL_FILE, load_external_data=False)
    inits = {i.name for i in proto.graph.initializer}
    inputs = {v.name: {"shape": [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]}
              for v in proto.graph.input if v.name not in inits}
    types = {onnx.TensorProto.DataType.Name(t.data_type).lower() for t in proto.graph.initializer}
    return {"inputs": inputs, "initializer_types": sorted(types)}


def reduced_precision(onnx_dir: Path, dest: Path) -> tuple[Path, str]:
    """The ONNX graph converted to fp16 (inputs and outputs kept fp32) in `dest`; returns it and how it was made."""
    import onnx
    import onnxruntime
    from onnxruntime.transformers.float16 import convert_float_to_float16

    # onnx refuses external data reached through a file with several hard links (every store blob is one).
    work = dest / "src"
    work.mkdir(parents=True)
    for name in (MODEL_FILE, DATA_FILE):
        if (onnx_dir / name).exists():
            shutil.copyfile(onnx_dir / name, work / name)
    proto = onnx.load_model(work / MODEL_FILE, load_external_data=True)
    converted = convert_float_to_float16(proto, keep_io_types=True, disable_shape_infer=True)
    out = dest / "fp16"
    out.mkdir()
    onnx.save_model(converted, out / MODEL_FILE, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=DATA_FILE, size_threshold=1024)
    how = (f"onnxruntime {onnxruntime.__version__} float16.convert_float_to_float16(keep_io_types=True): "
           "weights and compute fp16, graph inputs and outputs fp32")
    return out, how


@dataclass(frozen=True)
class Built:
    """One engine's bytes and how it was built."""

    plan: bytes
    build_s: float
    timing_cache: str  # "warm", "cold" or "none"
    messages: tuple[str, ...] = ()


def timing_cache_path(cache_root: Path | None, backend: str, version: str, target: str, gpu: Gpu | None) -> Path | None:
    """`<store>/caches/tensorrt/<backend>-<version>-<target>[-<gpu>].timing`: one per GPU and TensorRT version."""
    if cache_root is None:
        return None
    gpu_part = "" if gpu is None else "-" + "".join(c if c.isalnum() else "_" for c in gpu.name)
    return cache_root / "tensorrt" / f"{backend}-{version}-{target}{gpu_part}.timing"


def build(backend: str, onnx_model: Path, target: str, profiles: dict[str, Profile], *, hardware: str = "none",
          version_compatible: bool = False, cache: Path | None = None) -> Built:
    """Parse the ONNX file and build a serialized plan for one compute capability."""
    trt = _backend(backend)
    logger = _collector(trt)
    builder = trt.Builder(logger)
    # Strongly typed: the graph's types decide precision. TensorRT for RTX networks always are (flag 0).
    strong = getattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)  # TensorRT 11: the only kind
    flags = 0 if backend == "tensorrt-rtx" or strong is None else 1 << int(strong)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_model)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BuildFailed(f"the TensorRT ONNX parser refused {onnx_model.name}: {errors[:500]}",
                          hint="MREG_DEBUG=1 shows the traceback; nothing was published")
    config = builder.create_builder_config()
    if backend == "tensorrt-rtx":
        config.num_compute_capabilities = 1
        config.set_compute_capability(getattr(trt.ComputeCapability, "SM" + target[3:]), 0)
    else:  # tensorrt only: the target is the local GPU; compatibility widens where the plan loads
        config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, HARDWARE_LEVELS[hardware])
    if version_compatible:
        config.set_flag(trt.BuilderFlag.VERSION_COMPATIBLE)
    profile = builder.create_optimization_profile()
    for name, (lo, opt, hi) in profiles.items():
        profile.set_shape(name, lo, opt, hi)
    config.add_optimization_profile(profile)
    state = "none"
    timing: Any = None
    # TensorRT for RTX builds ahead of time without timing kernels: its timing-cache calls are no-ops
    # (deprecated since RTX 1.2), so only full TensorRT gets one; RTX's own cache is a runtime (JIT) cache.
    if cache is not None and backend == "tensorrt":
        blob = cache.read_bytes() if cache.is_file() else b""
        state = "warm" if blob else "cold"
        timing = config.create_timing_cache(blob)
        config.set_timing_cache(timing, False)
    t0 = time.monotonic()
    plan = builder.build_serialized_network(network, config)
    elapsed = time.monotonic() - t0
    if plan is None:
        said = "; ".join(logger.messages)[:500]
        raise BuildFailed(f"{backend} could not build an engine for {target} from {onnx_model.name}: {said}",
                          hint="MREG_DEBUG=1 and a smaller shapes= profile may help; nothing was published")
    if timing is not None and cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        atomic.write_bytes(cache, bytes(memoryview(timing.serialize())))
    return Built(bytes(memoryview(plan)), elapsed, state, tuple(logger.messages))


def _collector(trt: Any) -> Any:
    """A TensorRT logger that keeps errors and warnings for the record instead of printing them."""

    class Collector(trt.ILogger):  # type: ignore[misc]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: list[str] = []

        def log(self, severity: Any, msg: str) -> None:
            if severity <= trt.ILogger.Severity.WARNING:
                self.messages.append(f"{str(severity).rsplit('.', 1)[-1]}: {msg.strip()}")

    return Collector()


def read_config(onnx_dir: Path) -> dict[str, Any]:
    """config.json of the ONNX artifact (its side files), or {}."""
    path = onnx_dir / "config.json"
    return dict(json.loads(path.read_text(encoding="utf-8"))) if path.is_file() else {}


def temp_dir(near: Path) -> tempfile.TemporaryDirectory[str]:
    """A scratch directory on the store's filesystem, next to the work directory."""
    return tempfile.TemporaryDirectory(prefix=".tensorrt-", dir=near)
