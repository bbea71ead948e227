"""Will an ONNX export fit in this machine's memory? Planned from the safetensors headers, before any weight is loaded.

An export holds the model in PyTorch, traces it, writes the graph and runs it in ONNX Runtime: its
peak grows with the weights. Running out is an OOM kill, which leaves nothing to report, so the
conversion refuses up front (exit 7, InsufficientMemory) with both numbers when the estimate does
not fit.

The estimate, from `weights` (the checkpoint's parameter count, exact from the headers, times 2 bytes
in float16, else 4) and `largest` (its largest tensor in float32: an embedding table or output
projection), is the largest of the conversion's phases, calibrated on the peaks measured by
benchmarks/onnx_memory.py (peak anonymous memory of the process tree, sampled every 20 ms) at
Qwen2.5-0.5B, 1.5B and 3B shapes (0.5 B: 2.8 GiB, 1.5 B: 5.1 GiB, 3 B: 9.2 GiB):
- fp16, the phases that hold the float16 model (loading, the PyTorch reference, float32 one module
  at a time (upcast.py), and the TorchScript export, traced without its weights, which are then
  written from the model one tensor at a time (initializers.py)), and ONNX Runtime's verification:
  WEIGHT_FACTOR x weights + largest + BASE_BYTES. Per stage at 3 B (weights 5.7 GiB, largest 1.2 GiB,
  process tree): loading 6.1 GiB, reference 7.4, export 6.9, after the weights are released 2.6, and
  ONNX Runtime's verification 9.1 GiB: at that size the unoptimized float16 session holds about the
  weights again in anonymous memory (at 0.5 B it maps them from the file; why it differs was not
  pinned down), so the peak is that phase's, 1.29 x weights + largest + BASE_BYTES at 3 B (1.26 at 1.5 B);
- fp16, dynamo export: its onnx_ir model holds copies of the weights while it is built and saved:
  graphs under 2 GB about 5 x weights (one protobuf), larger ones 2.4 x (as measured for the former
  TorchScript export with weights);
- fp16, ONNX Runtime (unoptimized on the CPU, weights mapped from the file): BASE_BYTES + 3 x largest
  (the output projection cast to float32 as its MatMul runs) + PROBE_BYTES (the probes' logits,
  PyTorch's and ONNX Runtime's, over a 152 K vocabulary: the peak at 0.5 B);
- fp32 (and int8, from fp32): not calibrated; 3 x weights + BASE_BYTES, the model, the exporter's
  copy and ONNX Runtime's.

What the machine has: /proc/meminfo's MemAvailable (free memory plus the page cache and slabs the
kernel can reclaim), capped by the memory cgroup's limit less its usage (cgroup v2 `memory.max`,
else v1 `memory.limit_in_bytes`) where the process runs in one, since a container's limit is what
its OOM killer enforces.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.errors import InsufficientSpace

#: The fixed part: torch, transformers and ONNX Runtime loaded, activations of the probes (measured: 485-501 MiB).
BASE_BYTES = 640 << 20
#: Bytes of memory per weight byte at the peak, ONNX Runtime's verification (measured: 1.26 at 1.5 B, 1.29 at 3 B).
WEIGHT_FACTOR = 1.35
#: ONNX Runtime's phase beyond the weights it maps: the probes' logits and their copies (measured at 0.5 B: 2.8 GiB
#: peak with 3 x largest = 1.5 GiB).
PROBE_BYTES = 768 << 20
#: A dynamo graph this large or more is saved tensor by tensor (protobuf's limit); below, in one message.
PROTOBUF_LIMIT = 2 << 30
#: Bytes of memory per weight byte when a graph holding its weights is serialized in one protobuf (measured through
#: the CLI with the TorchScript exporter's weight-holding export: 4.5 at 0.5 B, weights 1 GB and the peak 5.1 GB).
INLINE_FACTOR = 5.0
#: Bytes of memory per weight byte when a graph holding its weights is saved tensor by tensor (measured the same way
#: at 1.5 B, weights 2.9 GiB: peaks of 4.9, 6.1 and 6.6 GiB in three runs; the exporter holds copies of weights).
FILE_FACTOR = 2.4
#: Bytes of memory per weight byte, float32 exports (not calibrated: the model, the exporter's and ONNX Runtime's).
FP32_FACTOR = 3.0
#: Where cgroup file systems are mounted.
CGROUP_ROOT = Path("/sys/fs/cgroup")


class InsufficientMemory(InsufficientSpace):
    """The export would need more memory than the machine (or its cgroup) has: refused before loading."""

    def __init__(self, plan: Plan, what: str) -> None:
        super().__init__(
            f"--to {what} of {plan.parameters / 1e9:.2f} B parameters needs about {_gib(plan.needed)} of memory; "
            f"this machine has {_gib(plan.available)} available ({plan.where})",
            hint="run it on a machine with more memory, free some, or convert to GGUF (--to gguf:F16 streams "
                 "tensor by tensor, at a flat few hundred MB)",
            details={"needed_bytes": plan.needed, "available_bytes": plan.available, "parameters": plan.parameters,
                     "available_from": plan.where},
        )
        self.plan = plan


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


@dataclass(frozen=True)
class Plan:
    """The estimate for one export and what the machine has."""

    parameters: int
    weight_bytes: int
    largest: int
    needed: int
    available: int
    where: str

    @property
    def fits(self) -> bool:
        """Whether the estimate is within what is available."""
        return self.needed <= self.available


def plan(headers: Iterable[Mapping[str, Any]], half: bool, weightless: bool = True) -> Plan:
    """The estimate for exporting the tensors of these safetensors headers (name -> entry with `.shape`), in float16
    with `half`, else float32, traced without the weights (`weightless`: the TorchScript exporter) or with them
    (dynamo); tied embeddings count once (a checkpoint stores them once)."""
    sizes = [math.prod(entry.shape) for header in headers for entry in header.values()]
    parameters, largest = sum(sizes), 4 * max(sizes, default=0)
    weights = parameters * (2 if half else 4)
    available, where = available_memory()
    return Plan(parameters, weights, largest, needed(weights, largest, half, weightless), available, where)


def needed(weights: int, largest: int, half: bool, weightless: bool) -> int:
    """Peak bytes of an export: the largest of its phases (see the module docstring), from the weights' bytes in
    the export's precision and the largest tensor's bytes in float32."""
    if not half:
        return int(weights * FP32_FACTOR + BASE_BYTES)
    export = 0.0 if weightless else weights * (INLINE_FACTOR if weights < PROTOBUF_LIMIT else FILE_FACTOR)
    return int(max(WEIGHT_FACTOR * weights + largest, export, 3 * largest + PROBE_BYTES) + BASE_BYTES)


def available_memory() -> tuple[int, str]:
    """Bytes this process can still allocate, and where the figure comes from."""
    found = _meminfo_available()
    best = (found, "MemAvailable in /proc/meminfo") if found is not None else (1 << 62, "unknown")
    headroom = _cgroup_headroom()
    if headroom is not None and headroom[0] < best[0]:
        best = headroom
    return best


def _meminfo_available(path: Path = Path("/proc/meminfo")) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "MemAvailable":
                return int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isascii() and text.isdigit() and len(text) <= 18 else None


def _inactive_file(stat: Path, key: str) -> int:
    """Reclaimable page cache charged to the cgroup (it counts in its usage, but the kernel drops it first)."""
    try:
        for line in stat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_headroom(root: Path = CGROUP_ROOT, membership: Path = Path("/proc/self/cgroup")) -> tuple[int, str] | None:
    """The tightest limit less usage over this process's memory cgroup and its ancestors, where any is set."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return None
    best: tuple[int, str] | None = None
    for line in lines:
        _, controllers, path = line.split(":", 2) if line.count(":") >= 2 else ("", "", "")
        if controllers == "":  # v2: limit in memory.max, usage in memory.current
            base, limit_name, usage_name, stat_key = root, "memory.max", "memory.current", "inactive_file"
        elif "memory" in controllers.split(","):
            base, limit_name, usage_name, stat_key = root / "memory", "memory.limit_in_bytes", \
                "memory.usage_in_bytes", "total_inactive_file"
        else:
            continue
        group = base / path.lstrip("/")
        # Inside a cgroup namespace the own group is mounted as the root: walk up to it, whichever exists.
        for directory in [group, *group.parents]:
            if not str(directory).startswith(str(base)):
                break
            limit, usage = _read_int(directory / limit_name), _read_int(directory / usage_name)
            if limit is None or usage is None or limit >= 1 << 60:  # "max", or v1's "no limit" (2^63 - page)
                continue
            room = max(0, limit - usage + _inactive_file(directory / "memory.stat", stat_key))
            if best is None or room < best[0]:
                best = (room, f"cgroup {directory / limit_name}: limit {_gib(limit)}")
    return best
