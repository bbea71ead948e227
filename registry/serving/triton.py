"""A Triton model repository view of a version, made of links into the store.

    <repo>/<name>/config.pbtxt                  platform, inputs, outputs, dims, batching, version policy
    <repo>/<name>/<n>/model.onnx -> …/models/<name>/versions/<n>/onnx/model.onnx   (and its data file)
    <repo>/<name>/<n>/model_sm86.plan -> …/tensorrt/<engine>/model.plan            (one per compute capability)

Each version directory is built under a temporary name and renamed into place, and config.pbtxt
is replaced atomically, so Triton's repository polling (or its load API) sees the old or the new
version, never half of one. Links are relative: keep the repository inside the store root
(e.g. `<store>/triton`) and mount the root, and they resolve inside the container too.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from manifests import Artifact, TensorRTRequirements
from registry import atomic, layout
from registry.errors import NotFound, UsageError
from registry.store.protocol import Version

#: ONNX TensorProto element types → Triton data types.
TRITON_TYPES = {1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 4: "TYPE_UINT16", 5: "TYPE_INT16", 6: "TYPE_INT32",
                7: "TYPE_INT64", 8: "TYPE_STRING", 9: "TYPE_BOOL", 10: "TYPE_FP16", 11: "TYPE_FP64",
                12: "TYPE_UINT32", 13: "TYPE_UINT64", 16: "TYPE_BF16"}


@dataclass(frozen=True)
class Tensor:
    """One input or output of the model."""

    name: str
    data_type: str
    dims: tuple[int, ...]


@dataclass(frozen=True)
class TritonExport:
    """What an export wrote, for which version."""

    name: str
    version: int
    model_dir: Path
    version_dir: Path
    platform: str
    config: str


def read_signature(model_path: Path) -> tuple[list[Tensor], list[Tensor]]:
    """Inputs and outputs of an ONNX graph (dynamic dimensions as -1), without loading its weights."""
    try:
        import onnx
    except ImportError as e:
        raise UsageError("exporting to Triton needs the onnx package", hint="pip install 'mreg[onnx]'") from e
    model = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}

    def tensors(values: Any) -> list[Tensor]:
        out = []
        for v in values:
            if v.name in inits:
                continue
            t = v.type.tensor_type
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim)
            out.append(Tensor(v.name, TRITON_TYPES.get(t.elem_type, "TYPE_INVALID"), dims))
        return out

    return tensors(model.graph.input), tensors(model.graph.output)


def render_config(name: str, platform: str, inputs: list[Tensor], outputs: list[Tensor], *, version: int,
                  max_batch_size: int, cc_files: dict[str, str] | None = None, default_file: str | None = None) -> str:
    """config.pbtxt text (Triton's ModelConfig in protobuf text format)."""
    batched = max_batch_size > 0 and all(t.dims and t.dims[0] == -1 for t in inputs + outputs)

    def block(kind: str, items: list[Tensor]) -> list[str]:
        lines = [f"{kind} ["]
        for i, t in enumerate(items):
            dims = t.dims[1:] if batched else t.dims
            lines += ["  {", f'    name: "{t.name}"', f"    data_type: {t.data_type}",
                      f"    dims: [ {', '.join(str(d) for d in dims)} ]", "  }" + ("," if i < len(items) - 1 else "")]
        return [*lines, "]"]

    lines = [f'name: "{name}"', f'platform: "{platform}"', f"max_batch_size: {max_batch_size if batched else 0}"]
    if default_file:
        lines.append(f'default_model_filename: "{default_file}"')
    for cc, file in sorted((cc_files or {}).items()):
        lines += ["cc_model_filenames [", "  {", f'    key: "{cc}"', f'    value: "{file}"', "  }", "]"]
    lines += block("input", inputs) + block("output", outputs)
    lines.append(f"version_policy: {{ specific: {{ versions: [ {version} ] }} }}")
    if batched:
        lines.append("dynamic_batching { }")
    return "\n".join(lines) + "\n"


def export(version: Version, repo: Path, *, max_batch_size: int = 8, prefer: str = "auto") -> TritonExport:
    """Write (or update) the Triton repository entry of a version; returns what was written."""
    arts = {a.format: a for a in version.manifest.artifacts}
    onnx_art = arts.get("onnx")
    trt_art = arts.get("tensorrt")
    if onnx_art is None:
        raise NotFound(f"{version.name}@{version.number} has no onnx artifact, which Triton's config is read from",
                       hint=f"run `mreg convert … --to onnx --name {version.name}`")
    vpath = Path(version.path)
    onnx_main = next(f.path for f in onnx_art.files if f.path.endswith(".onnx"))
    inputs, outputs = read_signature(vpath / onnx_art.path / onnx_main)
    use_trt = trt_art is not None and prefer in ("auto", "tensorrt")
    model_dir = layout.triton_model_dir(repo, version.name)
    model_dir.mkdir(parents=True, exist_ok=True)
    stage = atomic.temp_name(model_dir / str(version.number), "triton")
    stage.mkdir()
    try:
        default: str | None
        if use_trt and trt_art is not None:
            cc_files = _link_plans(vpath, trt_art, stage)
            platform, default = "tensorrt_plan", sorted(cc_files.values())[0]
        else:
            for f in onnx_art.files:
                _link(vpath / onnx_art.path / f.path, stage / f.path)
            cc_files, platform, default = {}, "onnxruntime_onnx", (onnx_main if onnx_main != "model.onnx" else None)
        config = render_config(version.name, platform, inputs, outputs, version=version.number,
                               max_batch_size=max_batch_size, cc_files=cc_files, default_file=default)
        final = model_dir / str(version.number)
        if final.exists():
            shutil.rmtree(final)
        os.rename(stage, final)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    atomic.write_bytes(model_dir / layout.TRITON_CONFIG, config.encode())
    return TritonExport(version.name, version.number, model_dir, final, platform, config)


def _link_plans(vpath: Path, art: Artifact, stage: Path) -> dict[str, str]:
    """One plan link per compute capability: `model_sm86.plan`, keyed "8.6" for cc_model_filenames."""
    req = art.requirements
    if not isinstance(req, TensorRTRequirements):
        raise UsageError("the tensorrt artifact does not record its compute capabilities", hint="rebuild it")
    out: dict[str, str] = {}
    files = {f.path for f in art.files}
    for cc, plan in sorted(req.engines.items()):  # the manifest says which plan serves which GPU
        if plan not in files:
            continue
        sm = cc.replace("sm_", "").replace(".", "")
        name = layout.triton_plan_name(sm)
        _link(vpath / art.path / plan, stage / name)
        out[f"{sm[:-1]}.{sm[-1]}"] = name
    if not out:
        raise NotFound("no TensorRT plan matches the recorded compute capabilities", hint="rebuild the engines")
    return out


def _link(target: Path, link: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, link.parent), link)
