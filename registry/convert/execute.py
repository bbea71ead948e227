"""Executing a conversion plan: reuse the version with the same key, or (holding its lease) stage, convert, verify,
publish."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from manifests import Artifact, ConverterInfo, Manifest, SourceInfo
from registry import atomic, layout, machine, provenance
from registry.cache import Snapshot
from registry.convert.configs import read_config
from registry.convert.modelinfo import read_model_info
from registry.convert.once import Waiting, run_once
from registry.convert.plan import AnyTarget, Planned, conversion_key, groups, prepare, with_prerequisites
from registry.convert.protocol import ConversionRequest, ConversionResult, Options
from registry.errors import IntegrityError
from registry.progress import NoProgress, Progress
from registry.refs import check_name
from registry.store.lease import Lease
from registry.store.local import LocalStore
from registry.store.protocol import Version
from registry.store.staging import Staging

if TYPE_CHECKING:
    from registry.store.s3 import S3Store  # botocore is imported only where an S3 store is opened


@dataclass(frozen=True)
class ConversionOutcome:
    """The version a conversion produced or found."""

    version: Version
    reused: bool
    duration_s: float
    #: The snapshot converted (a reused version may have been made from the same bytes under another name).
    source: SourceInfo


def convert(
    store: LocalStore | S3Store,
    snapshot: Snapshot,
    name: str,
    targets: Sequence[AnyTarget],
    *,
    copy: bool = False,
    progress: Progress | None = None,
    parent: Version | None = None,
    wait: bool = True,
    on_wait: Callable[[Waiting], None] | None = None,
    config: dict[str, Any] | None = None,
) -> ConversionOutcome:
    """Make (or find) the version of `name` holding `targets` converted from `snapshot`.

    With `parent`, the new version carries the parent's artifacts (links to the same blobs, no
    copy) and adds or replaces the targets; a target that needs another format (TensorRT needs
    ONNX) finds it among them, or has it made first with default options.

    One run per key does the work, on any number of machines sharing the store
    (`registry.convert.once`): the others wait for its version (`on_wait` says who they wait for),
    or with `wait=False` raise LeaseHeld at once. Into an S3 store the version is built in a
    temporary local store, then pushed (blobs, create-only manifest, key index). `config`: the source's
    config.json as already read (by `registry.source`), else it is read here once for every reader.
    """
    check_name(name)
    progress = progress or NoProgress()
    started = time.monotonic()
    plan, carried, key = planned(snapshot, targets, parent)

    def work(lease: Lease) -> Version:
        if isinstance(store, LocalStore):
            return _make(store, snapshot, name, key, plan, carried, parent, copy=copy, progress=progress,
                         before_publish=lease.confirm, config=config)
        return _make_remote(store, snapshot, name, key, plan, copy=copy, progress=progress, lease=lease,
                            config=config)

    done = run_once(store.conversion_slot(name, key), name, key, find=lambda: store.find_by_key(name, key),
                    work=work, wait=wait, on_wait=on_wait)
    version = done.made or done.found
    assert version is not None
    return ConversionOutcome(version, done.made is None, time.monotonic() - started, snapshot.record.source)


def planned(snapshot: Snapshot, targets: Sequence[AnyTarget],
            parent: Version | None = None) -> tuple[list[Planned], list[Artifact], str]:
    """The targets to make (after what they need), the parent's artifacts carried along, and the conversion key
    (targets already prepared are taken as they are: nothing is read twice)."""
    prepared = prepare(targets)
    requested = [t.format for t in prepared]
    carried = [a for a in (parent.manifest.artifacts if parent else ()) if a.format not in requested]
    plan = with_prerequisites(prepared, {a.format for a in carried})
    key = conversion_key(
        snapshot.record.source,
        [(a.format, a.converter.name, a.converter.version, a.options, a.tool_versions) for a in carried]
        + [(c.format, c.name, c.version, p.options, tools) for c, p, tools in plan],
    )
    return plan, carried, key


def _make_remote(remote: S3Store, snapshot: Snapshot, name: str, key: str, plan: list[Planned], *, copy: bool,
                 progress: Progress, lease: Lease, config: dict[str, Any] | None) -> Version:
    """Build the version in a temporary local store, then push it: the push's own order (blobs, create-only
    manifest, key index) is what keeps a killed run from leaving a partial version in the bucket."""
    from registry.store.s3_transfer import S3Sink
    from registry.store.transfer import push

    # $TMPDIR on the cache's filesystem makes the work store's copies of the source hard links. Named by host and
    # pid, so that the next run here removes what a killed one left.
    tmp = Path(tempfile.gettempdir())
    atomic.sweep(tmp, _WORK_TAG)
    work = atomic.temp_name(tmp / "mreg-convert", _WORK_TAG)
    work.mkdir()
    try:
        local = LocalStore(work)
        made = _make(local, snapshot, name, key, plan, [], None, copy=copy, progress=progress,
                     before_publish=lambda: None, config=config)
        lease.confirm()
        return push(S3Sink(remote), local, made, progress=progress).version
    finally:
        atomic.remove_tree(work, root=tmp)


_WORK_TAG = "work"


def _read_config(snapshot: Snapshot) -> dict[str, Any] | None:
    """The snapshot's config.json, read once for the manifest and every converter (None: none, or damaged)."""
    has = any(f.path == "config.json" for f in snapshot.record.source.files)
    return read_config(snapshot.file("config.json")) if has else None


def _make(store: LocalStore, snapshot: Snapshot, name: str, key: str, plan: list[Planned], carried: list[Artifact],
          parent: Version | None, *, copy: bool, progress: Progress, before_publish: Callable[[], None],
          config: dict[str, Any] | None) -> Version:
    """Stage, convert every group, verify, publish (once `before_publish` allows it): the new version."""
    config = config if config is not None else _read_config(snapshot)
    with store.writers():
        staging = store.stage(name)
        try:
            artifacts = [staging.carry(a) for a in carried]
            for group in groups(plan):
                artifacts += _run_group(staging, snapshot, name, group, artifacts, copy=copy, progress=progress,
                                        config=config)
            manifest = Manifest(
                name=name,
                version=1,
                key=key,
                parent=parent.number if parent else None,
                source=snapshot.record.source,
                artifacts=tuple(artifacts),
                model=read_model_info(snapshot.record.source, snapshot.file, config),
                created=provenance.now(),
            )
            snapshot.check_unchanged()  # a linked directory written to while it was read: nothing is published
            before_publish()
            return store.publish(staging, manifest)
        except BaseException:
            staging.discard()
            raise


def _run_group(staging: Staging, snapshot: Snapshot, name: str, group: list[Planned], artifacts: list[Artifact],
               *, copy: bool, progress: Progress, config: dict[str, Any] | None) -> list[Artifact]:
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
        options=prepared.options,
        files=prepared.files,
        workdir=workdir,
        progress=progress,
        place=place,
        artifacts={a.format: staging.path / a.path for a in artifacts},
        artifact_digests={a.format: {f.path: f.sha256 for f in a.files} for a in artifacts},
        cache_dir=layout.caches_dir(staging.store.root),
        name=name,
        config=config,
    ) for _, prepared, _ in group]
    try:
        results = conv.convert_many(requests) if len(group) > 1 else [conv.convert(requests[0])]
    except OSError as e:  # a full disk while a converter writes is exit 7 for every format, as for copies
        atomic.raise_if_full(e, staging.path)
        raise
    made = []
    for (_, prepared, tools), result in zip(group, results, strict=True):
        opts = prepared.options
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
