"""The format `tensorrt`: engines built from the version's ONNX artifact, one per compute capability.

`--to tensorrt[:SPEC]`, SPEC being comma-separated `key=value` tokens (or bare flags), each at most once:

    backend=tensorrt-rtx|tensorrt   TensorRT for RTX (default: builds ahead of time, no GPU needed) or
                                    TensorRT (builds on the local GPU, for it)
    target=sm_86+sm_89              compute capabilities, one engine each ('+'-separated; sm_86, sm86, 8.6);
                                    default: the local GPU's
    precision=fp32|fp16             fp16: the ONNX graph is converted first (fp32 inputs/outputs kept)
    shapes=NAME=MIN:OPT:MAX;...     profile of an input, each shape `1x128`; others default from the
                                    graph's dynamic axes (batch 1:1:8, sequences 1:128:min(512, context))
    hwcompat=none|ampere+|same-cc   backend=tensorrt only: hardware-compatibility level
    version-compatible              plans that load on later TensorRT versions (VERSION_COMPATIBLE)

e.g. `--to tensorrt:target=sm_86+sm_89,precision=fp16,shapes=input_ids=1x1:1x128:8x512;attention_mask=1x1:1x128:8x512`.
`mreg convert`'s --backend, --target, --shapes and --precision set the same options, read as their keys are
(`--target sm_86,sm_89 --shapes input_ids=…,attention_mask=…`: commas where the spec has `+` and `;`).
The tree is `<backend>-<sm>-<trt version>-<precision>/model.plan` + `engine.json` (its binding) per
target. The version's ONNX artifact is made first (default options) when it has none. Full TensorRT
keeps its timing cache in `<store>/caches/tensorrt/` per backend, version, target and GPU; TensorRT
for RTX times no kernels ahead of time (its timing-cache calls are no-ops), so it keeps none.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from converters.tensorrt.binding import (
    PLAN_FILE,
    RECORD_FILE,
    RTX_TARGETS,
    detect_gpus,
    gate_problems,
    normalize_target,
    pick_plan,
    resolve_plan,
)
from manifests import Artifact, EngineRecord, TensorRTRequirements
from registry.convert.protocol import (
    ConversionRequest,
    ConversionResult,
    Converter,
    ConverterBase,
    Options,
    Prepared,
    RawOptions,
    TargetOptions,
    spec_of,
    stage,
)
from registry.errors import UsageError
from registry.progress import Progress

BACKENDS = ("tensorrt-rtx", "tensorrt")
HARDWARE = ("none", "ampere+", "same-cc")
GRAMMAR = ("comma-separated: backend=tensorrt-rtx|tensorrt, target=sm_86+sm_89, precision=fp32|fp16, "
           "shapes=NAME=MINxDIMS:OPT:MAX;NAME=…, hwcompat=none|ampere+|same-cc, version-compatible "
           "(e.g. --to tensorrt:target=sm_86+sm_89,precision=fp16)")
_SHAPE = re.compile(r"\A[0-9]+(x[0-9]+)*\Z")


def _shape(text: str, where: str) -> list[int]:
    if not _SHAPE.match(text):
        raise UsageError(f"bad shape {text!r} in {where}", hint="shapes are dims joined by x, e.g. 8x512")
    return [int(d) for d in text.split("x")]


def parse_shapes(text: str) -> dict[str, list[list[int]]]:
    """`input_ids=1x1:1x128:8x512;mask=…` -> {name: [min, opt, max]}; min <= opt <= max per dimension. Entries are
    `;`-separated in a spec (whose options a comma separates) and may be `,`-separated in `--shapes`."""
    out: dict[str, list[list[int]]] = {}
    for item in filter(None, (s.strip() for s in re.split("[;,]", text))):
        name, eq, ranges = item.partition("=")
        parts = ranges.split(":")
        if not eq or not name or len(parts) != 3:
            raise UsageError(f"bad shapes= entry {item!r}", hint="NAME=MIN:OPT:MAX, e.g. input_ids=1x1:1x128:8x512")
        lo, opt, hi = (_shape(p, item) for p in parts)
        if not len(lo) == len(opt) == len(hi) or any(not a <= b <= c for a, b, c in zip(lo, opt, hi, strict=True)):
            raise UsageError(f"shapes= {item!r}: min <= opt <= max must hold for every dimension, of one rank")
        if name in out:
            raise UsageError(f"shapes= names {name} twice", hint=GRAMMAR)
        out[name] = [lo, opt, hi]
    return dict(sorted(out.items()))


def _targets(text: str) -> list[str]:
    """`sm_89+8.6` (a spec's target=) or `sm_89,8.6` (`--target`) -> `["sm_86", "sm_89"]`."""
    return sorted({normalize_target(t) for part in text.split(",") for t in part.strip().split("+") if t.strip()},
                  key=lambda t: int(t[3:]))


#: The spec's key for each field that a flag of `mreg convert` sets (--backend, --target, --shapes, --precision).
_FLAG_KEYS = {"backend": "backend", "targets": "target", "shapes": "shapes", "precision": "precision"}


def _option(key: str, value: str, token: str) -> tuple[str, Any]:
    """One `key=value` of the spec (or the flag of that name, `--target` for target=) as the field it sets and
    its normalized value; `token` is what the user wrote, for the refusal."""
    if key == "backend" and value in BACKENDS:
        return "backend", value
    if key == "target":
        return "targets", _targets(value)
    if key == "precision" and value in ("fp32", "fp16"):
        return "precision", value
    if key == "shapes":
        return "shapes", parse_shapes(value)
    if key == "hwcompat" and value in HARDWARE:
        return "hardware_compatibility", value
    raise UsageError(f"bad --to tensorrt option {token!r}", hint=GRAMMAR)


def _given(spec: str) -> dict[str, Any]:
    """The options the spec sets, normalized (targets sorted and spelled `sm_86`); unknown or repeated keys
    refused."""
    opts: dict[str, Any] = {}
    seen: set[str] = set()
    for raw in spec.split(","):
        token = raw.strip()
        if not token:
            continue
        key, eq, value = token.partition("=")
        key = key.strip().lower()
        if key in seen:
            raise UsageError(f"--to tensorrt:{spec} sets {key} twice", hint=GRAMMAR)
        seen.add(key)
        if key == "version-compatible" and not eq:
            opts["version_compatible"] = True
        elif not eq:
            raise UsageError(f"unknown --to tensorrt option {token!r}", hint=GRAMMAR)
        else:
            field, normalized = _option(key, value, token)
            opts[field] = normalized
    return opts


def _with_defaults(given: Mapping[str, Any]) -> Options:
    """The options given, and the defaults of those left out (no targets: the local GPU's, found when prepared; no
    shapes: from the graph's dynamic axes)."""
    return {"backend": "tensorrt-rtx", "targets": [], "precision": "fp32", "shapes": {},
            "hardware_compatibility": "none", "version_compatible": False, **given}


def parse_spec(spec: str) -> Options:
    """The spec as given, normalized: targets sorted and spelled `sm_86`; unknown or repeated keys refused."""
    return _with_defaults(_given(spec))


@dataclasses.dataclass(frozen=True)
class TensorRTOptions:
    """`--to tensorrt:target=sm_86+sm_89,precision=fp16` typed (what `parse_spec` reads), or what the CLI's flags
    set; None: not given, the default filled when prepared (no targets: the local GPU's)."""

    format: ClassVar[str] = "tensorrt"
    backend: str | None = None
    targets: tuple[str, ...] | None = None
    precision: str | None = None
    shapes: Mapping[str, list[list[int]]] | None = None
    hardware_compatibility: str | None = None
    version_compatible: bool = False

    def spec(self) -> str:
        """The string form (`target=sm_86+sm_89,precision=fp16`), for messages."""
        shapes = ";".join(f"{name}={':'.join('x'.join(map(str, dims)) for dims in ranges)}"
                          for name, ranges in (self.shapes or {}).items())
        return ",".join(part for part in (
            f"backend={self.backend}" if self.backend is not None else "",
            f"target={'+'.join(self.targets)}" if self.targets is not None else "",
            f"shapes={shapes}" if self.shapes is not None else "",
            f"precision={self.precision}" if self.precision is not None else "",
            f"hwcompat={self.hardware_compatibility}" if self.hardware_compatibility is not None else "",
            "version-compatible" if self.version_compatible else "") if part)


def _typed(given: Mapping[str, Any]) -> TensorRTOptions:
    """The fields `_given` or `_option` read as the typed options (targets a tuple)."""
    return TensorRTOptions(**{**given, **({"targets": tuple(given["targets"])} if "targets" in given else {})})


def finish_options(opts: dict[str, Any]) -> dict[str, Any]:
    """Fill the targets from the local GPU where none were given; refuse what a backend cannot build."""
    if not opts["targets"]:
        gpus = detect_gpus()
        if not gpus:
            raise UsageError("--to tensorrt needs target=… on a machine without an NVIDIA GPU",
                             hint=f"e.g. --to tensorrt:target=sm_86+sm_89 (TensorRT for RTX: {', '.join(RTX_TARGETS)})")
        opts = {**opts, "targets": [gpus[0].compute_capability]}
    if opts["backend"] == "tensorrt-rtx":
        bad = [t for t in opts["targets"] if t not in RTX_TARGETS]
        if bad:
            raise UsageError(f"TensorRT for RTX does not build for {', '.join(bad)}",
                             hint=f"its targets: {', '.join(RTX_TARGETS)}; use backend=tensorrt on that GPU")
        if opts["hardware_compatibility"] != "none":
            raise UsageError("hwcompat= applies to backend=tensorrt; RTX engines are bound by target=", hint=GRAMMAR)
    else:
        gpus = detect_gpus()  # probed once per process
        here = gpus[0].compute_capability if gpus else None
        if opts["targets"] != [here]:
            raise UsageError(f"backend=tensorrt builds only for the local GPU ({here or 'none found'}), "
                             f"not {'+'.join(opts['targets'])}",
                             hint="use backend=tensorrt-rtx to build ahead of time for other GPUs")
    return opts


class TensorRTConverter(ConverterBase):
    """Builds one engine per target from the ONNX artifact, records each binding, verifies where it can run."""

    format: ClassVar[str] = "tensorrt"
    name: ClassVar[str] = "mreg.tensorrt"
    #: Part of the conversion key: raised when what a conversion checks changes, so older results are made again.
    #: 2: NaN/Inf in ONNX Runtime's or the engine's outputs fail verification.
    version: ClassVar[str] = "2"
    needs: ClassVar[tuple[str, ...]] = ("onnx",)

    def parse(self, raw: RawOptions) -> TensorRTOptions:
        """`{"spec": "target=sm_86,precision=fp16"}` -> `TensorRTOptions(targets=("sm_86",), precision="fp16")`."""
        return _typed(_given(spec_of("tensorrt", raw, GRAMMAR)))

    def apply_flags(self, options: TargetOptions, fields: Mapping[str, Any]) -> TensorRTOptions:
        """--backend, --target, --shapes and --precision (their text, by the field each sets) read as the spec's
        key of that name is (one grammar: `--target sm_86,sm_89` as `target=sm_86+sm_89`); a key the spec sets
        too is refused, as a key the spec gives twice is."""
        assert isinstance(options, TensorRTOptions)
        flags = _typed(dict(_option(_FLAG_KEYS[name], text, f"{_FLAG_KEYS[name]}={text}")
                            for name, text in fields.items()))
        for name in fields:
            if getattr(options, name) is not None:
                raise UsageError(f"--to tensorrt:{','.join(filter(None, (options.spec(), flags.spec())))} sets "
                                 f"{_FLAG_KEYS[name]} twice", hint=GRAMMAR)
        return dataclasses.replace(options, **{name: getattr(flags, name) for name in fields})

    def prepare(self, options: TargetOptions) -> Prepared:
        """The normalized options (part of the conversion key): defaults for what is not given, targets filled
        from the local GPU, checked."""
        assert isinstance(options, TensorRTOptions)
        given = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)
                 if getattr(options, f.name) is not None}
        return Prepared(self.format, finish_options(_with_defaults({
            **given, "targets": list(options.targets or ()), "shapes": dict(options.shapes or {})})))

    def tool_versions(self) -> dict[str, str]:
        """Versions of both backends' packages where installed (metadata only), and the fp16 converter's."""
        from importlib import metadata

        from converters.tensorrt.build import installed

        out: dict[str, str] = {}
        for backend in BACKENDS:
            found = installed(backend)
            if found is not None:
                out[backend] = found[0]
        for dist in ("onnx", "onnxruntime"):
            with contextlib.suppress(metadata.PackageNotFoundError):
                out[dist] = metadata.version(dist)
        return out

    def convert(self, request: ConversionRequest) -> ConversionResult:
        """Build every target's engine into the work directory, write its record, verify, fill the requirements.

        Kept in one piece (about 70 lines): its stages share the parsed graph, the profiles and each
        engine's record, and the full-TensorRT branch runs only on a GPU, which CI does not have: it is
        not restructured where it cannot be tested.
        """
        from converters.tensorrt import build as tb
        from converters.tensorrt import verify as tensorrt_verify

        opts = request.options
        backend = opts["backend"]
        found = tb.installed(backend)
        if found is None:
            raise tb.MissingBackend(backend)
        trt_version, cuda = found
        onnx_dir = request.artifacts.get("onnx")
        if onnx_dir is None or not (onnx_dir / tb.MODEL_FILE).is_file():
            raise UsageError("--to tensorrt builds from the version's ONNX artifact, and there is none",
                             hint="add --to onnx to the same command")
        config = tb.read_config(onnx_dir)
        graph = tb.describe(onnx_dir)
        profiles = tb.profiles_for(graph, config, opts["shapes"])
        recorded = request.artifact_digests["onnx"]  # the ONNX files were hashed when they were stored
        onnx_files = {n: recorded[n] for n in (tb.MODEL_FILE, tb.DATA_FILE) if n in recorded}
        gpus = detect_gpus()
        built_on = gpus[0].name if gpus and backend == "tensorrt" else None
        engines: dict[str, str] = {}
        build_s: dict[str, float] = {}
        caches: dict[str, str] = {}
        known: dict[str, str] = {}
        how: str | None = None
        with tb.temp_dir(request.workdir.parent) as tmp:
            model = onnx_dir / tb.MODEL_FILE
            if opts["precision"] == "fp16" and "float" in graph["initializer_types"]:
                with _stage(request.progress, "fp16 graph conversion"):
                    fp16_dir, how = tb.reduced_precision(onnx_dir, Path(tmp))
                model = fp16_dir / tb.MODEL_FILE
            elif opts["precision"] == "fp16":
                how = "none needed: the ONNX artifact's weights are already fp16"
            for target in opts["targets"]:
                sm = target.replace("_", "")
                rel_dir = f"{backend}-{sm}-{trt_version}-{opts['precision']}"
                cache = tb.timing_cache_path(request.cache_dir if backend == "tensorrt" else None, backend,
                                             trt_version, target, gpus[0] if built_on else None)
                with _stage(request.progress, f"building the {target} engine"):
                    built = tb.build(backend, model, target, profiles, hardware=opts["hardware_compatibility"],
                                     version_compatible=opts["version_compatible"], cache=cache)
                out = request.workdir / rel_dir
                out.mkdir()
                (out / PLAN_FILE).write_bytes(built.plan)
                plan_sha = hashlib.sha256(built.plan).hexdigest()
                record = EngineRecord(
                    backend=backend, tensorrt_version=trt_version, cuda=cuda, compute_capability=target,
                    hardware_compatibility=opts["hardware_compatibility"],
                    version_compatible=opts["version_compatible"], precision=opts["precision"],
                    built_on_gpu=built_on, profiles=profiles, onnx_files=onnx_files, plan_sha256=plan_sha,
                    plan_bytes=len(built.plan), build_s=round(built.build_s, 6), timing_cache=built.timing_cache,
                    builder_messages=built.messages)
                (out / RECORD_FILE).write_text(json.dumps(record.model_dump(mode="json"), indent=2, sort_keys=True)
                                               + "\n", encoding="utf-8")
                known[f"{rel_dir}/{PLAN_FILE}"] = plan_sha
                engines[target] = f"{rel_dir}/{PLAN_FILE}"
                build_s[target] = round(built.build_s, 6)
                caches[target] = built.timing_cache
        with _stage(request.progress, "verification"):
            verification = tensorrt_verify.verify(
                backend, {t: request.workdir / p for t, p in engines.items()}, onnx_dir / tb.MODEL_FILE, profiles,
                opts["precision"], gpus, int(config.get("vocab_size") or 100),
                f"ONNX Runtime on the onnx artifact (model.onnx sha256 {onnx_files[tb.MODEL_FILE][:12]})")
        requirements = TensorRTRequirements(
            backend=backend, tensorrt_version=trt_version, cuda=cuda, compute_capabilities=tuple(opts["targets"]),
            hardware_compatibility=opts["hardware_compatibility"], version_compatible=opts["version_compatible"],
            precision=opts["precision"], built_on_gpu=built_on, profiles=profiles, onnx_files=onnx_files,
            engines=engines, build_s=build_s, timing_cache=caches, precision_conversion=how)
        return ConversionResult(verification=verification, known_digests=known, requirements=requirements,
                                tool_versions={"tensorrt.backend": backend, "tensorrt.version": trt_version})

    def gate_problems(self, artifact: Artifact | None, requirement: str) -> list[str]:
        """`tensorrt:sm_80,sm_90`: an engine for each of these compute capabilities; plain `tensorrt`: any."""
        if ":" not in requirement:
            return super().gate_problems(artifact, requirement)
        return gate_problems(artifact, requirement)

    def engine_file(self, label: str, artifact: Artifact, artifact_dir: Path | None) -> str:
        """The plan built for this machine's GPU; with local files, its recorded binding checked."""
        if artifact_dir is not None:
            return resolve_plan(label, artifact, artifact_dir)[0].relative_to(artifact_dir).as_posix()
        return pick_plan(label, artifact, detect_gpus())[0]


def _stage(progress: Progress, name: str) -> contextlib.AbstractContextManager[None]:
    return stage(progress, "TensorRT", name)


#: What `registry.convert.formats` loads; the annotation has mypy check the class against the protocol.
CONVERTER: Converter = TensorRTConverter()
