"""`mreg show --memory`: a version's serving-memory plan as JSON and as lines, with the engine command lines."""

from __future__ import annotations

import shlex
from typing import Any

from manifests import Manifest
from registry.serving.memory import GIB, MemoryPlan
from registry.units import human_size

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
            "engines": {e: {"args": args, "command": _command(e, version_path, manifest, f.format, args)}
                        for e, args in f.engines.items()},
            "notes": list(f.notes)} for f in plan.fits],
        "notes": list(plan.notes),
    }


def _command(engine: str, version_path: str, manifest: Manifest, fmt: str, args: list[str]) -> str:
    path = f"{version_path}/{_main_file(manifest, fmt)}"
    return " ".join([ENGINE_COMMANDS[engine].format(path=shlex.quote(path)), *map(shlex.quote, args)])


def memory_lines(plan: MemoryPlan, version_path: str, manifest: Manifest) -> list[str]:
    """The plan as lines of `mreg show --memory`."""
    per = plan.kv.bytes_per_token.get(plan.cache_type, 0)
    lines = [f"  serving   {plan.memory_bytes / GIB:g} GiB × {plan.utilization:g} − {human_size(plan.reserve_bytes)} "
             f"reserve; KV cache {plan.cache_type}: {human_size(per)} per token"
             + (f" + {human_size(plan.kv.window_bytes_per_token.get(plan.cache_type, 0))} per token of the "
                f"{plan.kv.sliding_window}-token window" if plan.kv.window_bytes_per_token else "")
             + f"; {plan.context} tokens per sequence ({plan.context_from})"]
    for f in plan.fits:
        limit = f" (model max {plan.model_context})" if plan.model_context and f.max_context < f.max_context_fit else ""
        lines.append(f"    {f.format:<8} weights {human_size(f.weights_bytes)}, cache {human_size(f.cache_bytes)}: "
                     f"{f.sequences} sequences of {plan.context} tokens, or one of {f.max_context} tokens{limit}")
        lines += [f"{'':13}{_command(e, version_path, manifest, f.format, args)}" for e, args in f.engines.items()]
        lines += [f"             note: {n}" for n in f.notes]
    lines += [f"    note: {n}" for n in plan.notes]
    return lines
