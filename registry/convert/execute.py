"""Executing a conversion plan: reuse the version with the same key, or stage, convert, verify, publish."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from manifests import Artifact, ConverterInfo, Manifest, SourceInfo
from registry import atomic, layout, machine, provenance
from registry.cache import Snapshot
from registry.convert.modelinfo import read_model_info
from registry.convert.plan import Planned, conversion_key, groups, with_prerequisites
from registry.convert.protocol import ConversionRequest, ConversionResult, Options, Target
from registry.errors import IntegrityError
from registry.progress import NoProgress, Progress
from registry.refs import check_name
from registry.store.local import LocalStore
from registry.store.protocol import Version
from registry.store.staging import Staging


@dataclass(frozen=True)
class ConversionOutcome:
    """The version a conversion produced or found."""

    version: Version
    reused: bool
    duration_s: float
    #: The snapshot converted (a reused version may have been made from the same bytes under another name).
    source: SourceInfo


def convert(
    store: LocalStore,
    snapshot: Snapshot,
    name: str,
    targets: Sequence[Target],
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
    plan = with_prerequisites(targets, {a.format for a in carried})
    key = conversion_key(
        snapshot.record.source,
        [(a.format, a.converter.name, a.converter.version, a.options, a.tool_versions) for a in carried]
        + [(c.format, c.name, c.version, opts, tools) for c, opts, tools in plan],
    )
    existing = store.find_by_key(name, key)
    if existing is None:
        # The same conversion started elsewhere (a CI job run twice): wait for it, then find its version.
        with atomic.flock(layout.conversion_lock(store.root, name, key)):
            existing = store.find_by_key(name, key)
            if existing is None:
                return _make(store, snapshot, name, key, plan, carried, parent, copy=copy, progress=progress,
                             started=started)
    return ConversionOutcome(existing, True, time.monotonic() - started, snapshot.record.source)


def _make(store: LocalStore, snapshot: Snapshot, name: str, key: str, plan: list[Planned], carried: list[Artifact],
          parent: Version | None, *, copy: bool, progress: Progress, started: float) -> ConversionOutcome:
    """Stage, convert every group, verify, publish: the new version."""
    with store.writers():
        staging = store.stage(name)
        try:
            artifacts = [staging.carry(a) for a in carried]
            for group in groups(plan):
                artifacts += _run_group(staging, snapshot, name, group, artifacts, copy=copy, progress=progress)
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
            snapshot.check_unchanged()  # a linked directory written to while it was read: nothing is published
            version = store.publish(staging, manifest)
        except BaseException:
            staging.discard()
            raise
    return ConversionOutcome(version, False, time.monotonic() - started, snapshot.record.source)


def _run_group(staging: Staging, snapshot: Snapshot, name: str, group: list[Planned], artifacts: list[Artifact],
               *, copy: bool, progress: Progress) -> list[Artifact]:
    """Convert one run of targets (several of one format share its directory) and ingest what each wrote."""
    conv = group[0][0]
    t0 = time.monotonic()
    workdir = staging.path / conv.format
    workdir.mkdir(exist_ok=True)
    before = {p.relative_to(workdir).as_posix() for p in workdir.rglob("*") if p.is_file()}
    # A linked snapshot's files are the user's: copied (and verified) into the store, never hard-linked.
    place = staging.placer(conv.format, copy=copy or snapshot.linked,
                           trusted_before=snapshot.record.pulled.at.timestamp(), progress=progress)
    requests = [ConversionRequest(
        source=snapshot.record.source,
        source_files=snapshot.file,
        options=opts,
        workdir=workdir,
        progress=progress,
        place=place,
        artifacts={a.format: staging.path / a.path for a in artifacts},
        artifact_digests={a.format: {f.path: f.sha256 for f in a.files} for a in artifacts},
        cache_dir=layout.caches_dir(staging.store.root),
        name=name,
    ) for _, opts, _ in group]
    try:
        results = conv.convert_many(requests) if len(group) > 1 else [conv.convert(requests[0])]
    except OSError as e:  # a full disk while a converter writes is exit 7 for every format, as for copies
        atomic.raise_if_full(e, staging.path)
        raise
    made = []
    for (_, opts, tools), result in zip(group, results, strict=True):
        _refuse_failed(conv.format, opts, result, snapshot.record.source.repo)
        # Each artifact lists only the files its own converter wrote.
        others = {rel for r in results if r is not result for rel in r.known_digests}
        files = staging.ingest(conv.format, result.known_digests, progress, skip=before | others)
        made.append(Artifact(
            format=conv.format,
            path=conv.format,
            files=files,
            converter=ConverterInfo(name=conv.name, version=conv.version),
            options=opts,
            tool_versions={**tools, **result.tool_versions},
            duration_s=round(time.monotonic() - t0, 6),
            requirements=result.requirements,
            verification=result.verification,
            weights_bytes=result.weights_bytes,
            built_on=machine.here(),
        ))
    return made


def _refuse_failed(fmt: str, options: Options, result: ConversionResult, repo: str) -> None:
    """A failed verification stops the conversion: nothing is published."""
    if result.verification.status == "failed":
        raise IntegrityError(
            f"{fmt} conversion of {repo} failed verification: "
            f"{result.verification.detail or result.verification.method}",
            hint="nothing was published; with --json, error.details holds the verification "
                 "record (metrics against tolerances)",
            details={"format": fmt, "options": options, "verification": result.verification},
        )
