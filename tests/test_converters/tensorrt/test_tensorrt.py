"""`mreg convert --to tensorrt`: real TensorRT for RTX engines built without a GPU, their binding recorded,
resolved against a (simulated) local GPU, gated at promotion and exported to Triton.

One module-scoped store holds a tiny llama's ONNX export (version 1) and RTX engines for sm_86 and
sm_89 built from it (version 2). A GPU is simulated only by a fake `nvidia-smi` on PATH: that tests
our parsing of its output, never an engine run. Tests that need a real GPU skip without one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok, run

from converters.tensorrt.binding import (
    EngineMismatch,
    Gpu,
    _probe_gpus,
    check_plan,
    detect_gpus,
    normalize_target,
    parse_nvidia_smi,
)
from converters.tensorrt.converter import CONVERTER, GRAMMAR, parse_spec
from registry.errors import UsageError

HEAVY = ("tensorrt_rtx", "onnx", "onnxruntime", "torch", "transformers", "onnxscript")


def _have(*modules: str) -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in modules)


needs_rtx = pytest.mark.skipif(not _have(*HEAVY), reason="needs mreg[onnx] and mreg[tensorrt] (tensorrt-rtx-cu13)")
needs_gpu = pytest.mark.skipif(not detect_gpus(), reason="needs an NVIDIA GPU (run tests/test_converters on one)")


# --------------------------------------------------------------------------- spec grammar, no heavy imports


def test_spec_normalizes_targets_shapes_and_flags() -> None:
    opts = parse_spec("target=8.9+sm86+sm_120, precision=fp16,version-compatible,"
                      "shapes=input_ids=1x1:1x64:4x128;attention_mask=1x1:1x64:4x128")
    assert opts == {"backend": "tensorrt-rtx", "targets": ["sm_86", "sm_89", "sm_120"], "precision": "fp16",
                    "shapes": {"attention_mask": [[1, 1], [1, 64], [4, 128]], "input_ids": [[1, 1], [1, 64], [4, 128]]},
                    "hardware_compatibility": "none", "version_compatible": True}
    assert CONVERTER.options({"spec": "target=sm_89+sm_86"}) == CONVERTER.options({"spec": "target=sm_86+sm_89"})
    typed = CONVERTER.parse({"spec": "backend=tensorrt-rtx,shapes=input_ids=1x1:1x64:4x128,target=8.9+sm86,"
                                     "version-compatible,hwcompat=none,precision=fp16"})
    assert CONVERTER.parse({"spec": typed.spec()}) == typed  # the form messages quote reads back as it was


@pytest.mark.parametrize(("spec", "fields", "message"), [
    ("target=sm_86", {"targets": "sm_89"}, "--to tensorrt:target=sm_86,target=sm_89 sets target twice"),
    ("precision=fp32,target=sm_86", {"precision": "fp32", "targets": "sm_86"},
     "--to tensorrt:target=sm_86,precision=fp32,target=sm_86,precision=fp32 sets precision twice"),
    ("shapes=a=1:2:3", {"shapes": "a=1:2:3, b=1:1:1"},
     "--to tensorrt:shapes=a=1:2:3,shapes=a=1:2:3;b=1:1:1 sets shapes twice"),
    ("", {"shapes": "input_ids=1x8:1x16"}, "bad shapes= entry 'input_ids=1x8:1x16'"),
    ("", {"shapes": "a=1:1:1,a=1:2:2"}, "shapes= names a twice"),
    ("", {"targets": "sm_86, ampere"}, "bad TensorRT target 'ampere'"),
])
def test_flag_refusals(spec: str, fields: dict[str, str], message: str) -> None:
    """--target, --shapes, … are read as the spec's keys are, and refused where the spec sets the same key."""
    with pytest.raises(UsageError, match=re.escape(message)) as info:
        CONVERTER.apply_flags(CONVERTER.parse({"spec": spec}), fields)
    assert info.value.exit_code == 2


@pytest.mark.parametrize(("spec", "message"), [
    ("target=sm_86,target=sm_89", "sets target twice"),
    ("precision=int4,target=sm_86", "bad --to tensorrt option 'precision=int4'"),
    ("fp16", "unknown --to tensorrt option 'fp16'"),
    ("target=ampere", "bad TensorRT target 'ampere'"),
    ("target=sm_86,shapes=input_ids=1x8:1x4:1x16", "min <= opt <= max"),
    ("target=sm_86,shapes=input_ids=1x8:1x16", "bad shapes= entry"),
])
def test_spec_refusals(spec: str, message: str) -> None:
    with pytest.raises(UsageError, match=message):
        CONVERTER.options({"spec": spec})


def test_backend_limits_are_refused_before_any_work(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi, hence no GPU
    monkeypatch.setitem(sys.modules, "pynvml", None)
    with pytest.raises(UsageError, match="does not build for sm_90") as info:
        CONVERTER.options({"spec": "target=sm_90"})
    assert "backend=tensorrt" in str(info.value.hint)
    with pytest.raises(UsageError, match=r"builds only for the local GPU \(none found\)"):
        CONVERTER.options({"spec": "backend=tensorrt,target=sm_86"})
    with pytest.raises(UsageError, match="needs target=… on a machine without an NVIDIA GPU") as info:
        CONVERTER.options({})
    assert "sm_86" in str(info.value.hint) and info.value.exit_code == 2
    with pytest.raises(UsageError, match="hwcompat= applies to backend=tensorrt"):
        CONVERTER.options({"spec": "target=sm_86,hwcompat=ampere+"})
    assert GRAMMAR.startswith("comma-separated")


def test_timing_cache_is_kept_per_backend_version_target_and_gpu(tmp_path: Path) -> None:
    from converters.tensorrt.build import timing_cache_path

    path = timing_cache_path(tmp_path, "tensorrt", "10.13.0", "sm_90", Gpu("NVIDIA H100 80GB HBM3", "sm_90"))
    assert path == tmp_path / "tensorrt" / "tensorrt-10.13.0-sm_90-NVIDIA_H100_80GB_HBM3.timing"
    assert timing_cache_path(None, "tensorrt", "10.13.0", "sm_90", None) is None


def test_targets_and_nvidia_smi_output_parse() -> None:
    assert [normalize_target(t) for t in ("sm_86", "SM89", "120", "8.6", "12.1")] == \
        ["sm_86", "sm_89", "sm_120", "sm_86", "sm_121"]
    assert parse_nvidia_smi("NVIDIA A10, 8.6\nNVIDIA GeForce RTX 5090, 12.0\n\n") == \
        [Gpu("NVIDIA A10", "sm_86"), Gpu("NVIDIA GeForce RTX 5090", "sm_120")]


def test_planning_imports_no_heavy_library() -> None:
    code = ("import sys; from registry.convert import formats; c = formats.get('tensorrt'); "
            "c.options({'spec': 'target=sm_86+sm_89,precision=fp16'}); c.tool_versions(); "
            "from registry.cli import main; "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).parents[3])
    assert out.stdout.strip() == "[]", out.stdout


# --------------------------------------------------------------------------- real RTX engines, no GPU


@dataclass(frozen=True)
class Built:
    """The module's store: tiny@1 is ONNX only, tiny@2 adds RTX engines for sm_86 and sm_89."""

    root: Path
    store: Path
    cache: Path
    seconds: float


def _run(*args: str | Path) -> Any:
    return ok(run(*args))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Export a tiny llama to ONNX, then build two RTX engines from it (through the CLI, no GPU)."""
    if not _have(*HEAVY):
        pytest.skip("needs mreg[onnx] and mreg[tensorrt]")
    from support.tiny_models import build_tiny_llama

    root = tmp_path_factory.mktemp("trt")
    home = root / "home"
    home.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        for key, value in {"HOME": home, "XDG_CONFIG_HOME": home / ".config", "HF_HOME": home / "hf",
                           "MREG_STORE": root / "store", "MREG_CACHE_DIR": root / "cache", "PATH": root}.items():
            mp.setenv(key, str(value))
        mp.setitem(sys.modules, "pynvml", None)
        src = build_tiny_llama(root / "llama")
        assert _run("convert", src, "--to", "onnx", "--name", "tiny", "--json")["version"] == 1
        doc = _run("convert", "tiny@1", "--to", "tensorrt:target=sm_89+sm_86", "--json")
        assert doc["version"] == 2 and doc["formats"] == ["onnx", "tensorrt"]
        assert doc["verification"] == {"onnx": "passed", "tensorrt": "unverified"}
    return Built(root, root / "store", root / "cache", doc["duration_s"])


@pytest.fixture
def store(built: Built, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Commands in this test use the module's store; PATH holds only what the test puts in tmp_path/bin."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("MREG_STORE", str(built.store))
    monkeypatch.setenv("MREG_CACHE_DIR", str(built.cache))
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setitem(sys.modules, "pynvml", None)  # a real NVML would outrank the fake nvidia-smi
    return built.store


def fake_gpu(line: str) -> None:
    """Put an `nvidia-smi` on PATH that answers the name/compute_cap query with `line`."""
    exe = Path(os.environ["PATH"].split(os.pathsep)[0]) / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\necho '{line}'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    _probe_gpus.cache_clear()  # mreg probes once per process; this test's "process" has a new GPU


def tensorrt_artifact(store: Path, version: int) -> tuple[dict[str, Any], Path]:
    """The tensorrt artifact record of a version and its directory."""
    vdir = store / "models" / "tiny" / "versions" / str(version)
    manifest = json.loads((vdir / "manifest.json").read_text())
    (art,) = [a for a in manifest["artifacts"] if a["format"] == "tensorrt"]
    return art, vdir / "tensorrt"


@needs_rtx
@pytest.mark.slow
def test_two_targets_one_version_tree_and_manifest(store: Path) -> None:
    art, tree = tensorrt_artifact(store, 2)
    dirs = {f"tensorrt-rtx-sm{sm}-1.7.1.116-fp32" for sm in (86, 89)}
    assert {f["path"] for f in art["files"]} == {f"{d}/{n}" for d in dirs for n in ("model.plan", "engine.json")}
    req = art["requirements"]
    assert req["kind"] == "tensorrt" and req["backend"] == "tensorrt-rtx" and req["tensorrt_version"] == "1.7.1.116"
    assert req["cuda"] == "13" and req["compute_capabilities"] == ["sm_86", "sm_89"] and req["precision"] == "fp32"
    assert req["hardware_compatibility"] == "none" and req["version_compatible"] is False
    assert req["built_on_gpu"] is None, "built ahead of time: no GPU took part"
    assert req["engines"] == {"sm_86": "tensorrt-rtx-sm86-1.7.1.116-fp32/model.plan",
                              "sm_89": "tensorrt-rtx-sm89-1.7.1.116-fp32/model.plan"}
    # Profiles default from the graph's dynamic axes: batch 1..8, sequence 1..min(512, context of 256).
    assert req["profiles"] == {n: [[1, 1], [1, 128], [8, 256]] for n in ("input_ids", "attention_mask", "position_ids")}
    onnx_files = {f["path"]: f["sha256"] for f in json.loads(
        (tree.parent / "manifest.json").read_text())["artifacts"][0]["files"]}
    assert req["onnx_files"] == {n: onnx_files[n] for n in ("model.onnx", "model.onnx.data")}
    assert all(0 < s < 60 for s in req["build_s"].values())
    # TensorRT for RTX times no kernels when it builds (its timing-cache calls are no-ops): none is kept.
    assert req["timing_cache"] == {"sm_86": "none", "sm_89": "none"} and not (store / "caches").exists()
    assert req["precision_conversion"] is None
    assert art["options"]["targets"] == ["sm_86", "sm_89"] and art["tool_versions"]["tensorrt-rtx"] == "1.7.1.116"
    v = art["verification"]
    assert v["status"] == "unverified", "an engine that never ran is never reported as verified"
    assert v["metrics"] == {"sm_86.executed": 0.0, "sm_89.executed": 0.0}
    assert "built but not executed: sm_86, sm_89 (no GPU on this machine)" in v["detail"]
    assert v["not_run"] == [f"engine {t} not run by TensorRT for RTX: no GPU on this machine"
                            for t in ("sm_86", "sm_89")]
    for target in ("sm_86", "sm_89"):
        plan = tree / req["engines"][target]
        assert plan.read_bytes()[:4] == b"vtrt"
        record = json.loads((plan.parent / "engine.json").read_text())
        assert record["compute_capability"] == target and record["plan_bytes"] == plan.stat().st_size > 1000
        assert record["onnx_files"] == req["onnx_files"] and record["build_s"] == req["build_s"][target]
        assert check_plan(plan, Gpu("test", target)).compute_capability == target


@needs_rtx
def test_same_conversion_is_reused_and_new_shapes_make_a_new_version(store: Path) -> None:
    again = _run("convert", "tiny@1", "--to", "tensorrt:target=sm_86+sm_89", "--json")
    assert again["version"] == 2 and again["reused"] is True
    shapes = "input_ids=1x1:2x16:4x64;attention_mask=1x1:2x16:4x64;position_ids=1x1:2x16:4x64"
    doc = _run("convert", "tiny@1", "--to", f"tensorrt:target=sm_86,shapes={shapes}", "--json")
    art, _ = tensorrt_artifact(store, doc["version"])
    req = art["requirements"]
    assert req["profiles"]["input_ids"] == [[1, 1], [2, 16], [4, 64]] and list(req["engines"]) == ["sm_86"]
    assert doc["key"] != again["key"], "the profile is part of the conversion key"


@needs_rtx
def test_fp16_converts_the_graph_first_and_records_how(store: Path) -> None:
    doc = _run("convert", "tiny@1", "--to", "tensorrt:target=sm_89,precision=fp16", "--json")
    art, tree = tensorrt_artifact(store, doc["version"])
    req = art["requirements"]
    assert req["precision"] == "fp16" and list(req["engines"]) == ["sm_89"]
    assert req["engines"]["sm_89"] == "tensorrt-rtx-sm89-1.7.1.116-fp16/model.plan"
    assert "convert_float_to_float16(keep_io_types=True)" in req["precision_conversion"]
    record = json.loads((tree / "tensorrt-rtx-sm89-1.7.1.116-fp16" / "engine.json").read_text())
    assert record["precision"] == "fp16" and isinstance(record["builder_messages"], list)


@needs_rtx
def test_engines_never_run_are_refused_by_require_loaded(mreg: Any, store: Path) -> None:
    r = mreg("promote", "tiny@2", "--require", "loaded", "--json")
    assert r.exit_code == 6, r.stderr
    assert "tensorrt artifact was never loaded" in r.stderr and "engine sm_86 not run by TensorRT for RTX" in r.stderr


@needs_rtx
def test_bad_shapes_name_the_graph_inputs(mreg: Any, store: Path) -> None:
    r = mreg("convert", "tiny@1", "--to", "tensorrt:target=sm_86,shapes=pixels=1x3:1x3:1x3", "--json")
    assert r.exit_code == 2 and "'pixels', which is not an input" in r.json["error"]["message"]
    assert "input_ids" in r.json["error"]["hint"]


@needs_rtx
def test_missing_backend_says_how_to_install(mreg: Any, store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from converters.tensorrt import build as tensorrt_build

    monkeypatch.setattr(tensorrt_build, "installed", lambda backend: None)
    r = mreg("convert", "tiny@1", "--to", "tensorrt:target=sm_75")
    assert r.exit_code == 2 and "needs the tensorrt-rtx-cu13 package" in r.stderr
    assert "pip install 'mreg[onnx,tensorrt]'" in r.stderr


@needs_rtx
def test_resolve_without_a_gpu_says_what_exists_and_what_to_run(mreg: Any, store: Path) -> None:
    r = mreg("resolve", "tiny@2", "--format", "tensorrt")
    assert r.exit_code == 3
    assert "tiny@2 has no TensorRT engine for this machine: no NVIDIA GPU found" in r.stderr
    assert "it has engines for sm_86, sm_89" in r.stderr
    assert "mreg convert tiny@2 --to tensorrt:target=sm_XX" in r.stderr


@needs_rtx
@pytest.mark.parametrize(("gpu", "sm"), [("NVIDIA A10, 8.6", "86"), ("NVIDIA L4, 8.9", "89")])
def test_resolve_prints_the_plan_of_the_local_gpu(mreg: Any, store: Path, gpu: str, sm: str) -> None:
    fake_gpu(gpu)
    r = mreg("resolve", "tiny@2", "--format", "tensorrt", "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json["path"] == str(store / "models/tiny/versions/2/tensorrt" /
                                 f"tensorrt-rtx-sm{sm}-1.7.1.116-fp32/model.plan")
    assert Path(r.json["path"]).read_bytes()[:4] == b"vtrt"


@needs_rtx
def test_resolve_names_the_gpu_and_the_build_command(mreg: Any, store: Path) -> None:
    fake_gpu("NVIDIA RTX A6000 Ada, 12.0")
    r = mreg("resolve", "tiny@2", "--format", "tensorrt", "--json")
    assert r.exit_code == 3 and r.json["error"]["type"] == "NoEngineForGpu"
    assert "GPU NVIDIA RTX A6000 Ada (sm_120); it has engines for sm_86, sm_89" in r.json["error"]["message"]
    assert r.json["error"]["hint"] == "run `mreg convert tiny@2 --to tensorrt:target=sm_86+sm_89+sm_120`"
    fake_gpu("NVIDIA H100 80GB HBM3, 9.0")  # RTX has no sm_90: full TensorRT, on that GPU
    r = mreg("resolve", "tiny@2", "--format", "tensorrt", "--json")
    assert r.json["error"]["hint"] == \
        "run `mreg convert tiny@2 --to tensorrt:backend=tensorrt` on a machine with that GPU"


@needs_rtx
def test_a_plan_whose_record_says_another_target_is_refused(mreg: Any, built: Built, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch, store: Path) -> None:
    copy = tmp_path / "store"
    shutil.copytree(built.store, copy, symlinks=True)
    monkeypatch.setenv("MREG_STORE", str(copy))
    tree = copy / "models/tiny/versions/2/tensorrt"
    sm86, sm89 = (tree / f"tensorrt-rtx-sm{sm}-1.7.1.116-fp32" for sm in (86, 89))
    (sm86 / "engine.json").chmod(0o644)
    (sm86 / "engine.json").write_bytes((sm89 / "engine.json").read_bytes())
    fake_gpu("NVIDIA A10, 8.6")
    r = mreg("resolve", "tiny@2", "--format", "tensorrt")
    assert r.exit_code == 4 and "refusing to load" in r.stderr
    assert "built for sm_89 (tensorrt-rtx 1.7.1.116), not for NVIDIA A10 (sm_86)" in r.stderr

    # The header and the digest are checked too, before TensorRT ever sees the bytes.
    plan = tmp_path / "x" / "model.plan"
    plan.parent.mkdir()
    shutil.copyfile(sm89 / "model.plan", plan)
    shutil.copyfile(sm89 / "engine.json", plan.parent / "engine.json")
    assert check_plan(plan, Gpu("NVIDIA L4", "sm_89")).compute_capability == "sm_89"
    with pytest.raises(EngineMismatch, match="not the manifest's"):
        check_plan(plan, None, "0" * 64)
    plan.write_bytes(b"ftrt" + plan.read_bytes()[4:-1])
    with pytest.raises(EngineMismatch, match="is not the recorded"):
        check_plan(plan, Gpu("NVIDIA L4", "sm_89"))
    plan.write_bytes(b"PK\x03\x04 not a plan")
    with pytest.raises(EngineMismatch, match="does not start like a TensorRT plan"):
        check_plan(plan, None)
    (plan.parent / "engine.json").unlink()
    with pytest.raises(EngineMismatch, match=r"has no engine\.json"):
        check_plan(plan, None)


@needs_rtx
def test_promotion_gate_requires_an_engine_per_target(mreg: Any, store: Path) -> None:
    r = mreg("promote", "tiny@2", "--alias", "gated", "--require", "tensorrt:sm_80,sm_90", "--json")
    assert r.exit_code == 6 and r.json["error"]["type"] == "GateRefused"
    msg = r.json["error"]["message"]
    assert "no TensorRT engine for sm_80" in msg and "no TensorRT engine for sm_90" in msg and "sm_86" in msg
    r = mreg("promote", "tiny@1", "--alias", "gated", "--require", "tensorrt:sm_86")
    assert r.exit_code == 6 and "no tensorrt artifact" in r.stderr
    r = mreg("promote", "tiny@2", "--alias", "gated", "--require", "tensorrt:8.6,sm_89", "--json")
    assert r.exit_code == 0 and r.json["to"] == 2


@needs_rtx
def test_triton_export_serves_one_plan_per_compute_capability(mreg: Any, store: Path, tmp_path: Path) -> None:
    repo = tmp_path / "triton"
    r = mreg("export", "triton", "tiny@2", "--repo", repo, "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json["platform"] == "tensorrt_plan"
    vdir = repo / "tiny" / "2"
    for sm in ("86", "89"):
        link = vdir / f"model_sm{sm}.plan"
        assert link.is_symlink() and link.resolve().read_bytes()[:4] == b"vtrt"
        assert f"sm{sm}" in os.readlink(link)
    text = (repo / "tiny" / "config.pbtxt").read_text()
    try:
        from google.protobuf import text_format
        from tritonclient.grpc import model_config_pb2
    except ImportError:  # structural check only: the config text parses nowhere here
        assert 'platform: "tensorrt_plan"' in text and 'key: "8.6"' in text and 'value: "model_sm89.plan"' in text
        return
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    assert config.platform == "tensorrt_plan" and config.max_batch_size == 8
    assert dict(config.cc_model_filenames) == {"8.6": "model_sm86.plan", "8.9": "model_sm89.plan"}
    assert [i.name for i in config.input] == ["input_ids", "attention_mask", "position_ids"]
    assert [list(i.dims) for i in config.input] == [[-1]] * 3 and config.output[0].name == "logits"
    assert list(config.version_policy.specific.versions) == [2]


# --------------------------------------------------------------------------- on a GPU (skipped without one)


@needs_rtx
@needs_gpu
def test_engine_for_the_local_gpu_runs_and_matches_onnx_runtime(built: Built, monkeypatch: pytest.MonkeyPatch,
                                                                mreg: Any) -> None:
    """On a GPU machine: RTX (where it supports the GPU) or full TensorRT builds, runs and verifies."""
    monkeypatch.setenv("MREG_STORE", str(built.store))
    monkeypatch.setenv("MREG_CACHE_DIR", str(built.cache))
    gpu = detect_gpus()[0]
    from converters.tensorrt.binding import RTX_TARGETS

    backend = "tensorrt-rtx" if gpu.compute_capability in RTX_TARGETS and _have("tensorrt_rtx") else "tensorrt"
    if backend == "tensorrt" and not _have("tensorrt"):
        pytest.skip("needs the tensorrt package for this GPU")
    r = mreg("convert", "tiny@1", "--to", f"tensorrt:backend={backend}", "--json")
    assert r.exit_code == 0, r.stderr
    art, _ = tensorrt_artifact(built.store, r.json["version"])
    assert art["verification"]["status"] == "passed", art["verification"]
    assert art["verification"]["metrics"][f"{gpu.compute_capability}.executed"] == 1.0
    version = r.json["version"]
    r = mreg("resolve", f"tiny@{version}", "--format", "tensorrt")
    assert r.exit_code == 0 and r.stdout.strip().endswith("model.plan")
    if backend == "tensorrt":  # its timing cache, kept in the store per GPU and version, makes rebuilds faster
        cold = art["requirements"]
        shapes = "input_ids=1x1:2x16:4x64;attention_mask=1x1:2x16:4x64;position_ids=1x1:2x16:4x64"
        r = mreg("convert", "tiny@1", "--to", f"tensorrt:backend=tensorrt,shapes={shapes}", "--json")
        warm = tensorrt_artifact(built.store, r.json["version"])[0]["requirements"]
        cc = gpu.compute_capability
        assert cold["timing_cache"] == {cc: "cold"} and warm["timing_cache"] == {cc: "warm"}
        assert cold["built_on_gpu"] == gpu.name
        print(f"\ntensorrt build {cc}: cold {cold['build_s'][cc]:.2f} s, warm {warm['build_s'][cc]:.2f} s")


@pytest.mark.parametrize("side", ["engine", "onnxruntime"])
def test_nan_on_either_side_fails_the_engine(side: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A NaN in the engine's outputs or in ONNX Runtime's fails, named; NaN must not read as agreement."""
    np = pytest.importorskip("numpy")
    pytest.importorskip("onnxruntime")
    from types import SimpleNamespace

    from converters.tensorrt import verify as trt_verify

    logits = np.ones((1, 4, 8), np.float32)
    poisoned = logits.copy()
    poisoned[0, 2, 3] = np.nan

    class Session:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def get_outputs(self) -> list[Any]:
            return [SimpleNamespace(name="logits")]

        def run(self, names: Any, feeds: Any) -> list[Any]:
            return [poisoned if side == "onnxruntime" else logits]

    monkeypatch.setattr("onnxruntime.InferenceSession", Session)
    monkeypatch.setattr(trt_verify, "run_plan", lambda *args: {"logits": poisoned if side == "engine" else logits})
    plan = tmp_path / "model.plan"
    plan.write_bytes(b"plan")
    v = trt_verify.verify("tensorrt", {"sm_89": plan}, tmp_path / "model.onnx", {"input_ids": ((1, 1), (1, 4), (2, 8))},
                          "fp32", [Gpu("test", "sm_89")], 320, "ref")
    who = {"engine": "the engine", "onnxruntime": "ONNX Runtime"}[side]
    assert v.status == "failed" and v.detail is not None
    assert f"sm_89: {who}'s logits at the min shape has 1 NaN/Inf values" in v.detail
    assert v.metrics[f"sm_89.{side}_nonfinite"] == 3.0 and v.metrics["sm_89.min_cosine"] == -1.0
    assert v.tolerance[f"sm_89.{side}_nonfinite"] == 0.0


def test_ampere_plus_engines_fit_any_ampere_or_later_gpu() -> None:
    from converters.tensorrt.binding import engine_for, fits
    from manifests import EngineRecord, TensorRTRequirements

    req = TensorRTRequirements(backend="tensorrt", tensorrt_version="10.13.0", compute_capabilities=("sm_86",),
                               hardware_compatibility="ampere+", precision="fp32",
                               engines={"sm_86": "tensorrt-sm86-10.13.0-fp32/model.plan"})
    assert engine_for(req, "sm_90") == engine_for(req, "sm_86") == "tensorrt-sm86-10.13.0-fp32/model.plan"
    assert engine_for(req, "sm_75") is None
    record = EngineRecord(backend="tensorrt", tensorrt_version="10.13.0", compute_capability="sm_86",
                          hardware_compatibility="ampere+", precision="fp32", profiles={}, onnx_files={},
                          plan_sha256="0" * 64, plan_bytes=1, build_s=1.0, timing_cache="cold")
    assert fits(record, Gpu("NVIDIA H100", "sm_90")) and not fits(record, Gpu("Tesla T4", "sm_75"))
    assert not fits(record.model_copy(update={"hardware_compatibility": "none"}), Gpu("NVIDIA H100", "sm_90"))


def test_cli_flags_set_what_the_spec_sets(mreg: Any, store: Path) -> None:
    r = mreg("convert", "tiny@1", "--to", "tensorrt", "--target", "sm_89,sm_86", "--precision", "fp32",
             "--backend", "tensorrt-rtx", "--json")
    assert r.exit_code == 0, r.stderr
    two = json.loads((store / "models" / "tiny" / "versions" / "2" / "manifest.json").read_text())
    assert (r.json["reused"], r.json["version"], r.json["key"]) == (True, 2, two["key"]), \
        "the key of --to tensorrt:target=sm_89+sm_86 (tiny@2)"
    arts = {a["format"]: a for a in mreg("show", f"tiny@{r.json['version']}", "--json").json["manifest"]["artifacts"]}
    assert arts["tensorrt"]["options"]["targets"] == ["sm_86", "sm_89"]
    assert mreg("convert", "tiny@1", "--to", "onnx", "--target", "sm_86").exit_code == 2
    twice = mreg("convert", "tiny@1", "--to", "tensorrt:target=sm_86", "--target", "sm_89")
    assert twice.exit_code == 2 and "twice" in twice.stderr
