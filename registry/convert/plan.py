"""Planning a conversion (pure): targets in order with what they need, options prepared once, the key.

The key is a sha256 over everything the result depends on (source bytes, converters, options,
tool versions): the same conversion run again finds its version instead of redoing the work.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from manifests import SourceInfo
from registry.convert import formats
from registry.convert.protocol import Converter, Options, Prepared, Target, TargetOptions
from registry.errors import UsageError

#: A target as planned: its converter, prepared options and tool versions.
Planned = tuple[Converter, Prepared, dict[str, str]]
#: A target in any form the API takes: `gguf:Q4_K_M`, `("gguf", {"spec": "Q4_K_M"})`, typed or prepared options.
AnyTarget = str | Target | TargetOptions | Prepared


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


def typed(target: str | Target | TargetOptions) -> TargetOptions:
    """A target as its converter's typed options: the string forms are parsed here, by the converter."""
    if isinstance(target, str):
        target = parse_target(target)
    if isinstance(target, tuple):
        fmt, raw = target
        return formats.get(fmt).parse(raw)
    return target


def prepare(targets: Sequence[AnyTarget]) -> list[Prepared]:
    """Every target's options checked and normalized, the files they name read once (prepared ones pass as they
    are); an unknown format, bad options or a target given twice are refused, before any download."""
    out = [t if isinstance(t, Prepared) else _prepare(typed(t)) for t in targets]
    refuse_repeats(out)
    return out


def _prepare(options: TargetOptions) -> Prepared:
    return formats.get(options.format).prepare(options)


def refuse_repeats(prepared: Sequence[Prepared]) -> None:
    """A target given twice with the same normalized options (gguf:Q8_0 and gguf:q8_0) is a usage error."""
    seen: set[str] = set()
    for p in prepared:
        key = json.dumps([p.format, p.options], sort_keys=True)
        if key in seen:
            spec = ",".join(f"{k}={v}" for k, v in sorted(p.options.items()))
            raise UsageError(f"--to {p.format} is given twice with the same options ({spec})",
                             hint="give each target once")
        seen.add(key)


def with_prerequisites(targets: Sequence[Prepared], carried: set[str]) -> list[Planned]:
    """Each target after the formats it needs (TensorRT needs ONNX), made first with default options
    unless the version carries them or they are requested."""
    requested = [t.format for t in targets]
    ordered: list[Prepared] = []
    for target in targets:
        for need in formats.get(target.format).needs:
            if need not in carried and need not in requested and need not in [t.format for t in ordered]:
                ordered.append(_prepare(formats.get(need).parse({})))
        ordered.append(target)
    plan = [(formats.get(t.format), t, formats.get(t.format).tool_versions()) for t in ordered]
    refuse_repeats([p for _, p, _ in plan])
    return plan


def with_flags(targets: Sequence[str | Target | TargetOptions], fmt: str, fields: Mapping[str, Any],
               flags: str) -> list[TargetOptions]:
    """Every target typed, with what typed flags give set on the options of every `--to fmt` target by its
    converter (`apply_flags`); flags without such a target are refused first."""
    if fields and not any(_format(t) == fmt for t in targets):
        raise UsageError(f"{flags} go with --to {fmt}", hint=f"add --to {fmt}, or drop those options")
    out = [typed(t) for t in targets]
    return [formats.get(fmt).apply_flags(t, fields) if fields and t.format == fmt else t for t in out]


def _format(target: str | Target | TargetOptions) -> str:
    """A target's format, its spec unread."""
    if isinstance(target, str):
        return parse_target(target)[0]
    return target[0] if isinstance(target, tuple) else target.format


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
