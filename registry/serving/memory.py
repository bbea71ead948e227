"""What a version costs to serve: how many sequences fit in a memory budget, and the engine settings that say so.

Read from the manifest alone (no weights opened): each artifact's `weights_bytes` and the model's
KV-cache bytes per token (`ModelInfo.kv_cache`, see registry.convert.kvcache). The budget is vLLM's:

    cache = memory × utilization − weights − reserve

`utilization` (default 0.9, vLLM's `--gpu-memory-utilization` default) leaves the rest of the device to
the CUDA context and other processes; `reserve` (default 1 GiB) holds activations and CUDA graphs inside
that share. A sequence of n tokens needs `full × n + window × min(n, W)` bytes of cache. The same
budget gives llama.cpp's `-c` (per-sequence context × slots) and `-np`.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass, field
from typing import Any

from manifests import Artifact, KVCache, Manifest
from registry.errors import NotFound, UsageError

GIB = 1 << 30
CACHE_TYPES = ("f16", "q8_0", "q4_0")
DEFAULT_UTILIZATION = 0.9
DEFAULT_RESERVE_GIB = 1.0
#: The default context when none is given: the model's own, capped here (few deployments serve 128 K per slot).
CONTEXT_CAP = 32768
#: When the config names no context length at all.
FALLBACK_CONTEXT = 4096
#: The engine that serves each format, and its cache-type flag's value for each mreg cache type (None: it has none).
VLLM_CACHE = {"f16": "auto", "q8_0": "fp8", "q4_0": None}


@dataclass(frozen=True)
class ArtifactFit:
    """One artifact's answer: its weights, how many sequences of `context` tokens fit, one sequence's longest."""

    format: str
    weights_bytes: int
    cache_bytes: int
    sequence_bytes: int
    sequences: int
    max_context: int
    #: The largest context the cache would hold, before the model's own limit caps it.
    max_context_fit: int
    engines: dict[str, list[str]] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class MemoryPlan:
    """The question and one answer per artifact that records its weights."""

    memory_bytes: int
    utilization: float
    reserve_bytes: int
    cache_type: str
    context: int
    context_from: str
    model_context: int | None
    kv: KVCache
    fits: tuple[ArtifactFit, ...]
    notes: tuple[str, ...] = ()


def sequence_bytes(kv: KVCache, tokens: int, cache_type: str, element_scale: float = 1.0) -> int:
    """KV-cache bytes of one sequence of `tokens` tokens."""
    full = kv.bytes_per_token.get(cache_type, 0) * element_scale
    window = kv.window_bytes_per_token.get(cache_type, 0) * element_scale
    span = min(tokens, kv.sliding_window) if kv.sliding_window else tokens
    return math.ceil(full * tokens + window * span)


def largest_context(kv: KVCache, budget: int, cache_type: str, element_scale: float = 1.0) -> int:
    """The most tokens one sequence can hold in `budget` bytes (capped at 2**31: a model without per-token cache)."""
    full = kv.bytes_per_token.get(cache_type, 0) * element_scale
    window = kv.window_bytes_per_token.get(cache_type, 0) * element_scale
    if budget <= 0:
        return 0
    limit = 1 << 31
    if kv.sliding_window and window:
        inside = int(budget // (full + window))
        if inside < kv.sliding_window:
            return inside
        rest = budget - window * kv.sliding_window
        return int(rest // full) if full else limit
    return int(budget // full) if full else limit


def _fit(a: Artifact, kv: KVCache, cache: int, context: int, model_context: int | None, cache_type: str,
         utilization: float) -> ArtifactFit:
    notes: list[str] = []
    scale = 1.0
    engines: dict[str, list[str]] = {}
    if a.format == "hf":
        vllm = VLLM_CACHE[cache_type]
        if vllm is None:
            notes.append(f"vLLM has no {cache_type} KV cache: no vLLM settings (use f16 or q8_0, served as fp8)")
        elif cache_type == "q8_0":
            scale = 32 / 34  # vLLM's fp8 cache: one byte per element, no block scales
            notes.append("vLLM caches q8_0's 8 bits as fp8 (1 byte per element): counted as fp8")
    seq = sequence_bytes(kv, context, cache_type, scale)
    n = int(cache // seq) if cache > 0 and seq else (0 if cache <= 0 else 1 << 16)
    fit = largest_context(kv, cache, cache_type, scale)
    longest = min(fit, model_context) if model_context else fit
    if cache <= 0:
        weights = (a.weights_bytes or 0) / GIB
        notes.append(f"the weights ({weights:.2f} GiB) and the reserve leave no room for a KV cache")
    if a.format == "hf" and VLLM_CACHE[cache_type] is not None and n:
        engines["vllm"] = ["--max-model-len", str(context), "--max-num-seqs", str(n),
                           "--gpu-memory-utilization", f"{utilization:g}", "--kv-cache-dtype",
                           str(VLLM_CACHE[cache_type])]
    if a.format == "gguf" and n:
        engines["llama.cpp"] = ["-c", str(context * n), "-np", str(n), "--cache-type-k", cache_type,
                                "--cache-type-v", cache_type]
        if cache_type != "f16":
            engines["llama.cpp"] += ["-fa", "on"]  # llama.cpp quantizes the V cache only with flash attention
    return ArtifactFit(a.format, a.weights_bytes or 0, max(0, cache), seq, n, longest, fit, engines, tuple(notes))


def plan(manifest: Manifest, memory_gib: float, *, context: int | None = None, cache_type: str = "f16",
         utilization: float = DEFAULT_UTILIZATION, reserve_gib: float = DEFAULT_RESERVE_GIB) -> MemoryPlan:
    """How many sequences of `context` tokens each artifact of the version serves in `memory_gib` GiB."""
    if not (math.isfinite(memory_gib) and memory_gib > 0):
        raise UsageError(f"--memory {memory_gib}: not a positive number of GiB", hint="e.g. --memory 80")
    if not 0 < utilization <= 1:
        raise UsageError(f"--utilization {utilization}: not in (0, 1]", hint="e.g. --utilization 0.9 (vLLM's default)")
    if not (math.isfinite(reserve_gib) and reserve_gib >= 0):
        raise UsageError(f"--reserve {reserve_gib}: not a non-negative number of GiB", hint="e.g. --reserve 1")
    if cache_type not in CACHE_TYPES:
        raise UsageError(f"--cache-type {cache_type}: unknown", hint=f"use one of {', '.join(CACHE_TYPES)}")
    if context is not None and context < 1:
        raise UsageError(f"--context {context}: not a positive number of tokens", hint="e.g. --context 8192")
    ref = f"{manifest.name}@{manifest.version}"
    kv = manifest.model.kv_cache if manifest.model else None
    if kv is None:
        raise NotFound(f"{ref} records no KV-cache figures (not a decoder, or made by an older mreg)",
                       hint="convert the version again with this mreg (`mreg convert NAME@REF --to FORMAT`)")
    artifacts = [a for a in manifest.artifacts if a.weights_bytes is not None]
    if not artifacts:
        raise NotFound(f"{ref} records no weights' bytes (made by an older mreg)",
                       hint="convert the version again with this mreg (`mreg convert NAME@REF --to FORMAT`)")
    model_context = manifest.model.context_length if manifest.model else None
    if context is not None:
        used, source = context, "given"
    elif model_context:
        used = min(model_context, CONTEXT_CAP)
        source = "model" if used == model_context else f"model's {model_context}, capped at {CONTEXT_CAP}"
    else:
        used, source = FALLBACK_CONTEXT, "default (the config names none)"
    notes = list(kv.notes)
    if model_context and used > model_context:
        notes.append(f"--context {used} is over the model's {model_context} tokens")
    memory, reserve = int(memory_gib * GIB), int(reserve_gib * GIB)
    fits = tuple(_fit(a, kv, int(memory * utilization) - a.weights_bytes - reserve, used, model_context, cache_type,
                      utilization) for a in artifacts if a.weights_bytes is not None)
    return MemoryPlan(memory, utilization, reserve, cache_type, used, source, model_context, kv, fits, tuple(notes))


ENGINE_COMMANDS = {"vllm": "vllm serve {path}", "llama.cpp": "llama-server -m {path}"}


def _main_file(manifest: Manifest, fmt: str) -> str:
    """The artifact's .gguf file for llama.cpp, its directory otherwise (what the engine is pointed at)."""
    art = next(a for a in manifest.artifacts if a.format == fmt)
    gguf = next((f.path for f in art.files if f.path.endswith(".gguf")), None)
    return f"{art.path}/{gguf}" if gguf else art.path


def memory_doc(plan: MemoryPlan, version_path: str, manifest: Manifest) -> dict[str, Any]:
    """The plan as `mreg show --memory --json` gives it."""
    return {
        "memory_bytes": plan.memory_bytes, "utilization": plan.utilization, "reserve_bytes": plan.reserve_bytes,
        "cache_type": plan.cache_type, "context": plan.context, "context_from": plan.context_from,
        "model_context": plan.model_context,
        "kv_bytes_per_token": plan.kv.bytes_per_token.get(plan.cache_type, 0),
        "kv_window_bytes_per_token": plan.kv.window_bytes_per_token.get(plan.cache_type, 0),
        "sliding_window": plan.kv.sliding_window,
        "artifacts": [{
            "format": f.format, "weights_bytes": f.weights_bytes, "cache_bytes": f.cache_bytes,
            "sequence_bytes": f.sequence_bytes, "sequences": f.sequences, "max_context": f.max_context,
            "max_context_fit": f.max_context_fit,
            "engines": {e: {"args": args, "command": engine_command(e, version_path, manifest, f.format, args)}
                        for e, args in f.engines.items()},
            "notes": list(f.notes)} for f in plan.fits],
        "notes": list(plan.notes),
    }


def engine_command(engine: str, version_path: str, manifest: Manifest, fmt: str, args: list[str]) -> str:
    """The engine's command line serving this artifact of the version with these settings."""
    path = f"{version_path}/{_main_file(manifest, fmt)}"
    return " ".join([ENGINE_COMMANDS[engine].format(path=shlex.quote(path)), *map(shlex.quote, args)])
