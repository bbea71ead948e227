"""The machine a conversion runs on, as each artifact records it (`Artifact.built_on`).

Recorded, never keyed: the conversion key names the work, not where it ran, so a version built on
one runner is found by every other. Probed once per process; every probe is optional (a machine
without /proc/cpuinfo or nvidia-smi records what it has).
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import socket
import subprocess
from importlib import metadata

from manifests import BuildGpu, BuildMachine
from registry import __version__

#: CPU flags that change how fast, or whether, a converter's kernels run (SIMD widths, fp16 and int8 dot products);
#: the full list is a hundred names that say nothing about a conversion.
KERNEL_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512", "avx_vnni", "amx", "asimd", "sve", "fphp")
#: Distributions whose version says which TensorRT a machine had (the engines' own record names the one used).
TENSORRT_DISTS = ("tensorrt", "tensorrt_cu13", "tensorrt_cu12",
                  "tensorrt_rtx", "tensorrt_rtx_cu13", "tensorrt_rtx_cu12")
#: nvidia-smi answers in well under a second where a driver is loaded; a hung driver must not hang a conversion.
NVIDIA_SMI_TIMEOUT_S = 10.0


@functools.cache
def here() -> BuildMachine:
    """This machine: host, CPU model and kernel-relevant flags, GPUs with driver and CUDA, TensorRT, mreg."""
    model, flags = _cpu()
    gpus, driver, cuda = _gpus()
    return BuildMachine(
        host=socket.gethostname(),
        os=f"{platform.system()} {platform.release()}",
        arch=platform.machine(),
        cpu=model,
        cpu_flags=flags,
        cpus=os.cpu_count() or 0,
        gpus=gpus,
        driver=driver,
        cuda=cuda,
        tensorrt=_tensorrt(),
        mreg_version=__version__,
        python=platform.python_version(),
    )


def _cpu() -> tuple[str | None, tuple[str, ...]]:
    """The CPU's model name and its kernel-relevant flags, from /proc/cpuinfo (Linux; elsewhere: platform's word)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return platform.processor() or None, ()
    model: str | None = None
    flags: set[str] = set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "Model", "Hardware") and model is None:
            model = value.strip() or None
        elif key in ("flags", "Features") and not flags:
            flags = set(value.split())
    kept = tuple(sorted(f for f in flags if f.startswith(KERNEL_FLAGS)))
    return model or platform.processor() or None, kept


def _gpus() -> tuple[tuple[BuildGpu, ...], str | None, str | None]:
    """GPUs (product, compute capability, memory) with the driver and its CUDA version, through nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return (), None, None
    try:
        listed = subprocess.run([exe, "--query-gpu=name,compute_cap,memory.total,driver_version",
                                 "--format=csv,noheader,nounits"], capture_output=True, text=True,
                                timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
        header = subprocess.run([exe], capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return (), None, None
    gpus, driver = [], None
    for line in listed.stdout.splitlines() if listed.returncode == 0 else []:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        name, cap, mem, driver = parts
        cc = f"sm_{cap.replace('.', '')}" if cap.replace(".", "").isdigit() else None
        gpus.append(BuildGpu(product=name, compute_capability=cc,
                             memory_mib=int(mem) if mem.isdigit() else None))
    cuda = None
    marker = "CUDA Version:"
    if marker in header.stdout:
        cuda = header.stdout.split(marker, 1)[1].split()[0].strip("|") or None
    return tuple(gpus), driver, cuda


def _tensorrt() -> dict[str, str]:
    """Installed TensorRT distributions and their versions (metadata only: nothing is imported)."""
    out = {}
    for dist in TENSORRT_DISTS:
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return out
