"""Conversion: key the inputs, reuse an existing version or run converters, then publish."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import converters
from converters import ConversionRequest
from manifests import Artifact, ConverterInfo, Manifest, SourceInfo
from registry import layout, provenance
from registry.cache import Snapshot
from registry.errors import IntegrityError, UsageError
from registry.modelinfo import read_model_info
from registry.progress import NoProgress, Progress
from registry.refs import check_name
from registry.store import LocalStore, Staging, Version


@dataclass(frozen=True)
class ConversionOutcome:
    """The version a conversion produced or found."""

    version: Version
    reused: bool
    duration_s: float


def conversion_key(source: SourceInfo, targets: Sequence[tuple[str, str, str, dict[str, Any], dict[str, str]]]) -> str:
    """sha256 over everything the result depends on: source bytes, converters, options, tool versions."""
    doc = {
        "source": {"commit": source.commit, "files": sorted((f.path, f.sha256) for f in source.files)},
        "targets": [
            {"format": fmt, "converter": name, "version": ver, "options": opts, "tools": tools}
            for fmt, name, ver, opts, tools in targets
        ],
    }
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def check_targets(targets: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """Refuse unknown formats, bad options and a target given twice (cheap: no heavy import), before any download."""
    _refuse_repeats([(fmt, converters.get(fmt).options(raw)) for fmt, raw in targets])


def _refuse_repeats(normalized: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """A target given twice with the same normalized options (gguf:Q8_0 and gguf:q8_0) is a usage error."""
    seen: set[str] = set()
    for fmt, options in normalized:
        key = json.dumps([fmt, options], sort_keys=True)
        if key in seen:
            spec = ",".join(f"{k}={v}" for k, v in sorted(options.items()))
            raise UsageError(f"--to {fmt} is given twice with the same options ({spec})", hint="give each target once")
        seen.add(key)


#: A target as planned: its converter, normalized options and tool versions.
Planned = tuple[converters.Converter, dict[str, Any], dict[str, str]]


def convert(
    store: LocalStore,
    snapshot: Snapshot,
    name: str,
    targets: Sequence[tuple[str, dict[str, Any]]],
    *,
    copy: bool = False,
    progress: Progress | None = None,
    parent: Version | None = None,
) -> ConversionOutcome:
    """Make (or find) the version of `name` holding `targets` converted from `snapshot`.

    With `parent`, the new version carries the parent's artifacts (links to the same blobs, no
    copy) and adds or replaces the targets; a target that needs another format (TensorRT needs
    ONNX) finds it among them, or has it made first with default options.
    """
    check_name(name)
    progress = progress or NoProgress()
    started = time.monotonic()
    requested = [fmt for fmt, _ in targets]
    carried = [a for a in (parent.manifest.artifacts if parent else ()) if a.format not in requested]
    carried_formats = {a.format for a in carried}
    ordered: list[tuple[str, dict[str, Any]]] = []
    for fmt, raw in targets:
        for need in getattr(converters.get(fmt), "needs", ()):
            if need not in carried_formats and need not in requested and need not in [f for f, _ in ordered]:
                ordered.append((need, {}))
        ordered.append((fmt, raw))
    plan: list[Planned] = []
    for fmt, raw in ordered:
        conv = converters.get(fmt)
        plan.append((conv, conv.options(raw), conv.tool_versions()))
    _refuse_repeats([(c.format, opts) for c, opts, _ in plan])
    key = conversion_key(
        snapshot.record.source,
        [(a.format, a.converter.name, a.converter.version, a.options, a.tool_versions) for a in carried]
        + [(c.format, c.name, c.version, opts, tools) for c, opts, tools in plan],
    )
    existing = store.find_by_key(name, key)
    if existing is not None:
        return ConversionOutcome(existing, True, time.monotonic() - started)
    trusted_before = snapshot.record.pulled.at.timestamp()
    with store.writers():
        staging = store.stage(name)
        try:
            artifacts = [_carry(store, staging, a) for a in carried]
            for group in _groups(plan):
                conv = group[0][0]
                t0 = time.monotonic()
                # Several targets of one format (gguf:Q8_0 and gguf:Q4_K_M) share its directory; each
                # artifact lists only the files its own converter wrote.
                workdir = staging.path / conv.format
                workdir.mkdir(exist_ok=True)
                before = {p.relative_to(workdir).as_posix() for p in workdir.rglob("*") if p.is_file()}
                made: dict[str, Path] = {a.format: staging.path / a.path for a in artifacts}
                digests: dict[str, dict[str, str]] = {a.format: {f.path: f.sha256 for f in a.files} for a in artifacts}
                requests = [ConversionRequest(
                    source=snapshot.record.source,
                    source_files=snapshot.file,
                    options=opts,
                    workdir=workdir,
                    progress=progress,
                    place=_placer(store, staging, conv.format, copy, trusted_before, progress),
                    artifacts=made,
                    artifact_digests=digests,
                    cache_dir=layout.caches_dir(store.root),
                    name=name,
                ) for _, opts, _ in group]
                many = getattr(conv, "convert_many", None)
                results = many(requests) if many is not None and len(group) > 1 else [conv.convert(requests[0])]
                for (_, opts, tools), result in zip(group, results, strict=True):
                    if result.verification.status == "failed":
                        raise IntegrityError(
                            f"{conv.format} conversion of {snapshot.record.source.repo} failed verification: "
                            f"{result.verification.detail or result.verification.method}",
                            hint="nothing was published; with --json, error.details holds the verification "
                                 "record (metrics against tolerances)",
                            details={"format": conv.format, "options": opts, "verification": result.verification},
                        )
                    others = {rel for r in results if r is not result for rel in r.known_digests}
                    files = staging.ingest(conv.format, result.known_digests, progress, skip=before | others)
                    artifacts.append(
                        Artifact(
                            format=conv.format,
                            path=conv.format,
                            files=files,
                            converter=ConverterInfo(name=conv.name, version=conv.version),
                            options=opts,
                            tool_versions={**tools, **result.tool_versions},
                            duration_s=round(time.monotonic() - t0, 6),
                            requirements=result.requirements,
                            verification=result.verification,
                        )
                    )
            manifest = Manifest(
                name=name,
                version=1,
                key=key,
                parent=parent.number if parent else None,
                source=snapshot.record.source,
                artifacts=tuple(artifacts),
                model=read_model_info(snapshot.record.source, snapshot.file),
                created=provenance.now(),
            )
            version = store.publish(staging, manifest)
        except BaseException:
            staging.discard()
            raise
    return ConversionOutcome(version, False, time.monotonic() - started)


def _groups(plan: list[Planned]) -> list[list[Planned]]:
    """The plan in runs: targets of a format whose converter has `convert_many` run together, at the first's place.

    Such a converter reads the source once for all of them (one pass over the tensors for
    gguf:F16 and gguf:Q4_K_M); every other target is a run of its own, in order.
    """
    groups: list[list[Planned]] = []
    shared: dict[str, list[Planned]] = {}
    for entry in plan:
        conv = entry[0]
        if not hasattr(conv, "convert_many"):
            groups.append([entry])
        elif conv.format in shared:
            shared[conv.format].append(entry)
        else:
            groups.append(shared.setdefault(conv.format, [entry]))
    return groups


def _carry(store: LocalStore, staging: Staging, art: Artifact) -> Artifact:
    """Bring a parent's artifact into the staging tree as links to its blobs; its record is unchanged."""
    from registry import layout

    for f in art.files:
        dest = staging.path / art.path / f.path
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.link(layout.blob_path(store.root, f.sha256), dest)
    return art


def _placer(store: LocalStore, staging: Staging, fmt: str, copy: bool, trusted_before: float,
            progress: Progress) -> converters.PlaceFile:
    """How source files enter an artifact tree: a hard link when possible and trusted, else a verified copy."""

    def place(src: Path, rel: str, sha256: str) -> str:
        dest = staging.path / fmt / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        st = src.stat()
        # The pull verified this file; trust its digest while it looks untouched since then.
        if not copy and st.st_mtime <= trusted_before + 1:
            try:
                os.link(src, dest)
                return sha256
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
        progress.start(f"copying {rel}", st.st_size)
        digest = store.add_blob_copy(src, dest, sha256, progress)
        progress.done()
        return digest

    return place
