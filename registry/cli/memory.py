"""`mreg show --memory`: a version's serving-memory plan as lines (its JSON: registry.serving.memory.memory_doc)."""

from __future__ import annotations

from manifests import Manifest
from registry.serving.memory import GIB, MemoryPlan, engine_command
from registry.units import human_size


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
        lines += [f"{'':13}{engine_command(e, version_path, manifest, f.format, args)}"
                  for e, args in f.engines.items()]
        lines += [f"             note: {n}" for n in f.notes]
    lines += [f"    note: {n}" for n in plan.notes]
    return lines

