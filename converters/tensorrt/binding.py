"""What binds a TensorRT engine to hardware: compute capabilities, the local GPU, the record beside each plan.

A plan only loads on the GPU family (and TensorRT version) it was built for, and TensorRT's own
answer to a mismatch is a `None` from deserialization. mreg records the binding in the manifest and
in `engine.json` beside every plan, and checks it here before anything loads the plan:

    tensorrt/<backend>-sm86-<trt version>-<precision>/model.plan
    tensorrt/<backend>-sm86-<trt version>-<precision>/engine.json    (EngineRecord)

Nothing here imports TensorRT: NVML (pynvml) is imported only when installed, else `nvidia-smi` answers.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from manifests import Artifact, EngineRecord, TensorRTRequirements
from registry.digest import sha256_file
from registry.errors import IntegrityError, NotFound, UsageError

PLAN_FILE = "model.plan"
RECORD_FILE = "engine.json"
#: Serialized plans start with one of these tags (TensorRT: "ftrt", TensorRT for RTX: "vtrt").
PLAN_MAGICS = (b"ftrt", b"vtrt")
Backend = Literal["tensorrt", "tensorrt-rtx"]
#: Compute capabilities TensorRT for RTX 1.7 builds for (its ComputeCapability enum).
RTX_TARGETS = ("sm_75", "sm_80", "sm_86", "sm_89", "sm_120", "sm_121")


@dataclass(frozen=True)
class Gpu:
    """One local NVIDIA GPU."""

    name: str
    compute_capability: str  # "sm_86"


class NoEngineForGpu(NotFound):
    """The version has no engine that loads on this machine's GPU."""


class EngineMismatch(IntegrityError):
    """A plan's record or header disagrees with the GPU or with the manifest: loading it would fail."""


def normalize_target(text: str) -> str:
    """`sm_86`, `sm86`, `86` or `8.6` -> `sm_86`; anything else is refused."""
    t = text.strip().lower()
    m = re.fullmatch(r"(?:sm_?)?(\d{2,3})|(\d{1,2})\.(\d)", t)
    if m is None:
        raise UsageError(f"bad TensorRT target {text!r}", hint="give a compute capability: sm_86, sm_89, 8.6, …")
    return f"sm_{m.group(1)}" if m.group(1) else f"sm_{m.group(2)}{m.group(3)}"


def parse_nvidia_smi(text: str) -> list[Gpu]:
    """GPUs from `nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader` output."""
    gpus = []
    for line in text.splitlines():
        name, _, cap = line.rpartition(",")
        if name.strip() and cap.strip():
            gpus.append(Gpu(name.strip(), normalize_target(cap)))
    return gpus


def detect_gpus() -> list[Gpu]:
    """The local NVIDIA GPUs, through NVML when pynvml is installed and works, else nvidia-smi; [] for none.

    Probed once per process: a convert asks when checking targets, planning and building.
    """
    return list(_probe_gpus())


@functools.cache
def _probe_gpus() -> tuple[Gpu, ...]:
    try:
        import pynvml  # type: ignore[import-not-found,unused-ignore]

        pynvml.nvmlInit()
        try:
            out = []
            for i in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(i)
                name = pynvml.nvmlDeviceGetName(handle)
                major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
                out.append(Gpu(name.decode() if isinstance(name, bytes) else str(name), f"sm_{major}{minor}"))
            return tuple(out)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no pynvml, or no driver: nvidia-smi may still answer
        pass
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        done = subprocess.run([exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return tuple(parse_nvidia_smi(done.stdout)) if done.returncode == 0 else ()


def describe_gpus(gpus: Sequence[Gpu]) -> str:
    """`NVIDIA A10 (sm_86)`, or `no NVIDIA GPU found`."""
    if not gpus:
        return "no NVIDIA GPU found (neither NVML nor nvidia-smi answered)"
    return ", ".join(f"{g.name} ({g.compute_capability})" for g in gpus)


def requirements_of(art: Artifact) -> TensorRTRequirements:
    """The recorded binding of a tensorrt artifact."""
    if not isinstance(art.requirements, TensorRTRequirements):
        raise UsageError("the tensorrt artifact records no binding", hint="rebuild it with `mreg convert`")
    return art.requirements


def build_command(ref: str, req: TensorRTRequirements, missing: str) -> str:
    """The command that makes a version holding the existing engines and one for `missing`."""
    if req.backend == "tensorrt" or missing not in RTX_TARGETS:
        # Full TensorRT builds one engine, on the GPU it serves: the command runs there.
        return f"mreg convert {ref} --to tensorrt:backend=tensorrt"
    targets = "+".join(sorted({*req.compute_capabilities, missing}, key=lambda t: int(t[3:])))
    return f"mreg convert {ref} --to tensorrt:target={targets}"


def pick_plan(ref: str, art: Artifact, gpus: Sequence[Gpu]) -> tuple[str, Gpu]:
    """The plan (relative to the artifact) built for the first local GPU; refuses with what exists and what to run."""
    req = requirements_of(art)
    have = ", ".join(req.compute_capabilities) or "none"
    plan = engine_for(req, gpus[0].compute_capability) if gpus else None
    if plan is not None:
        return plan, gpus[0]
    if not gpus:
        raise NoEngineForGpu(f"{ref} has no TensorRT engine for this machine: {describe_gpus(gpus)}; "
                             f"it has engines for {have}",
                             hint=f"on the serving machine run `mreg convert {ref} --to tensorrt:target=sm_XX`, "
                                  "sm_XX being what `nvidia-smi --query-gpu=compute_cap --format=csv` says")
    raise NoEngineForGpu(f"{ref} has no TensorRT engine for this machine's GPU {describe_gpus(gpus[:1])}; "
                         f"it has engines for {have}",
                         hint=f"run `{(cmd := build_command(ref, req, gpus[0].compute_capability))}`"
                              + (" on a machine with that GPU" if "backend=tensorrt" in cmd else ""))


def engine_for(req: TensorRTRequirements, target: str) -> str | None:
    """The plan built for `target`, or one whose Ampere+ hardware compatibility covers it."""
    if target in req.engines:
        return req.engines[target]
    if req.hardware_compatibility == "ampere+" and int(target[3:]) >= 80 and req.engines:
        return next(iter(req.engines.values()))
    return None


def check_plan(plan: Path, gpu: Gpu | None, expected_sha256: str | None = None) -> EngineRecord:
    """Refuse a plan whose record, digest or header says it will not load on `gpu`; return its record."""
    record_path = plan.parent / RECORD_FILE
    if not record_path.is_file():
        raise EngineMismatch(f"{plan} has no {RECORD_FILE} beside it: its binding is unknown",
                             hint="rebuild the engine with `mreg convert`")
    record = EngineRecord.model_validate_json(record_path.read_bytes())
    with plan.open("rb") as f:
        head = f.read(4)
    if head not in PLAN_MAGICS:
        raise EngineMismatch(f"{plan} does not start like a TensorRT plan (header {head.hex()})",
                             hint="the file is damaged or not a plan; rebuild it")
    digest = sha256_file(plan)
    problems = []
    if digest != record.plan_sha256:
        problems.append(f"its sha256 {digest[:12]} is not the recorded {record.plan_sha256[:12]}")
    if expected_sha256 is not None and digest != expected_sha256:
        problems.append(f"its sha256 {digest[:12]} is not the manifest's {expected_sha256[:12]}")
    if gpu is not None and not fits(record, gpu):
        problems.append(f"it was built for {record.compute_capability} ({record.backend} "
                        f"{record.tensorrt_version}), not for {gpu.name} ({gpu.compute_capability})")
    if problems:
        raise EngineMismatch(f"refusing to load {plan}: {'; '.join(problems)}",
                             hint="TensorRT would fail to deserialize it; rebuild it for this GPU")
    return record


def fits(record: EngineRecord, gpu: Gpu) -> bool:
    """Whether a plan with this record loads on `gpu` (same compute capability, or Ampere+ compatibility)."""
    if record.hardware_compatibility == "ampere+":
        return int(gpu.compute_capability[3:]) >= 80
    return record.compute_capability == gpu.compute_capability


def gate_problems(art: Artifact | None, requirement: str) -> list[str]:
    """`tensorrt:sm_80,sm_90`: every required target without an engine (or with a failed verification)."""
    targets = [normalize_target(t) for t in requirement.split(":", 1)[1].split(",") if t.strip()]
    if art is None:
        return [f"no tensorrt artifact (required by --require {requirement})"]
    req = requirements_of(art)
    plans = {f.path for f in art.files}
    problems = []
    for t in targets:
        plan = engine_for(req, t)
        if plan is None or plan not in plans:
            problems.append(f"no TensorRT engine for {t} (it has {', '.join(req.compute_capabilities) or 'none'}; "
                            f"required by --require {requirement})")
        elif art.verification.status == "failed":
            problems.append(f"the TensorRT engine for {t} failed verification")
    return problems


def resolve_plan(ref: str, art: Artifact, artifact_dir: Path) -> tuple[Path, Gpu]:
    """The path of the plan that fits the local GPU, checked against its record and the manifest."""
    gpus = detect_gpus()
    rel, gpu = pick_plan(ref, art, gpus)
    entry = next((f for f in art.files if f.path == rel), None)
    plan = artifact_dir / rel
    check_plan(Path(os.fspath(plan)), gpu, entry.sha256 if entry else None)
    return plan, gpu
