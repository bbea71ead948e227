"""Planning a conversion (pure): targets in order with what they need, options normalized, the key.

The key is a sha256 over everything the result depends on (source bytes, converters, options,
tool versions): the same conversion run again finds its version instead of redoing the work.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

from manifests import SourceInfo
from registry.convert import formats
from registry.convert.protocol import Converter, Options, Target
from registry.errors import UsageError

#: A target as planned: its converter, normalized options and tool versions.
Planned = tuple[Converter, Options, dict[str, str]]


def conversion_key(source: SourceInfo, targets: Sequence[tuple[str, str, str, Options, dict[str, str]]]) -> str:
    """sha256 over everything the result depends on: source bytes, converters, options, tool versions."""
    doc = {
        "source": {"commit": source.commit, "files": sorted((f.path, f.sha256) for f in source.files)},
        "targets": [
            {"format": fmt, "converter": name, "version": ver, "options": opts, "tools": tools}
            for fmt, name, ver, opts, tools in targets
        ],
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check_targets(targets: Sequence[Target]) -> None:
    """Refuse unknown formats, bad options and a target given twice (cheap: no heavy import), before any download."""
    refuse_repeats([(fmt, formats.get(fmt).options(raw)) for fmt, raw in targets])


def refuse_repeats(normalized: Sequence[Target]) -> None:
    """A target given twice with the same normalized options (gguf:Q8_0 and gguf:q8_0) is a usage error."""
    seen: set[str] = set()
    for fmt, options in normalized:
        key = json.dumps([fmt, options], sort_keys=True)
        if key in seen:
            spec = ",".join(f"{k}={v}" for k, v in sorted(options.items()))
            raise UsageError(f"--to {fmt} is given twice with the same options ({spec})", hint="give each target once")
        seen.add(key)


def with_prerequisites(targets: Sequence[Target], carried: set[str]) -> list[Planned]:
    """Each target after the formats it needs (TensorRT needs ONNX), made first with default options
    unless the version carries them or they are requested; every target's options normalized."""
    requested = [fmt for fmt, _ in targets]
    ordered: list[Target] = []
    for fmt, raw in targets:
        for need in formats.get(fmt).needs:
            if need not in carried and need not in requested and need not in [f for f, _ in ordered]:
                ordered.append((need, {}))
        ordered.append((fmt, raw))
    plan: list[Planned] = []
    for fmt, raw in ordered:
        conv = formats.get(fmt)
        plan.append((conv, conv.options(raw), conv.tool_versions()))
    refuse_repeats([(c.format, opts) for c, opts, _ in plan])
    return plan


def with_spec_flags(targets: list[Target], fmt: str, tokens: Sequence[str],
                    flags: str) -> list[Target]:
    """Fold `key=value` tokens given as separate flags into the spec of every `--to fmt` target."""
    if not tokens:
        return targets
    if not any(f == fmt for f, _ in targets):
        raise UsageError(f"{flags} go with --to {fmt}", hint=f"add --to {fmt}, or drop those options")
    return [(f, {"spec": ",".join(filter(None, [opts.get("spec", ""), *tokens]))} if f == fmt else opts)
            for f, opts in targets]


def parse_target(text: str) -> Target:
    """`gguf:Q8_0` → ("gguf", {"spec": "Q8_0"}); `hf` → ("hf", {})."""
    fmt, _, spec = text.partition(":")
    return fmt, ({"spec": spec} if spec else {})


def groups(plan: list[Planned]) -> list[list[Planned]]:
    """The plan in runs: targets of a format whose converter `converts_many` run together, at the first's place.

    Such a converter reads the source once for all of them (one pass over the tensors for
    gguf:F16 and gguf:Q4_K_M); every other target is a run of its own, in order.
    """
    groups: list[list[Planned]] = []
    shared: dict[str, list[Planned]] = {}
    for entry in plan:
        conv = entry[0]
        if not conv.converts_many:
            groups.append([entry])
        elif conv.format in shared:
            shared[conv.format].append(entry)
        else:
            groups.append(shared.setdefault(conv.format, [entry]))
    return groups
