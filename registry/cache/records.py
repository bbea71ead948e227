"""What mreg verified: pull records beside huggingface_hub's cache, and the snapshots they describe.

Layout (huggingface_hub's, plus mreg's records; names in `registry.layout`)::

    <cache>/
      models--org--name/blobs/<etag>            file contents
      models--org--name/snapshots/<commit>/…    symlinks into blobs
      models--org--name/refs/<branch>           the commit a branch pointed to
      .mreg/pulls/models--org--name/<commit>.json   what mreg verified (a PullRecord)
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from manifests import PullRecord, SourceFile
from registry import atomic, layout
from registry.cache.plan import is_commit, unsafe_reason


@dataclass(frozen=True)
class Snapshot:
    """A verified snapshot in the cache."""

    cache: Path
    record: PullRecord
    path: Path
    reused: bool = False
    downloaded_bytes: int = 0

    def file(self, rel: str) -> Path:
        """The real file (blob) behind one path of the snapshot."""
        return (self.path / rel).resolve()

def load_record(cache: Path, repo: str, commit: str) -> Snapshot | None:
    """A previously verified snapshot whose files are all still present, if any."""
    path = layout.pull_record_path(cache, repo, commit)
    try:
        record = PullRecord.model_validate_json(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    snap = layout.cache_snapshot_dir(cache, repo, commit)
    for f in record.source.files:
        try:
            if (snap / f.path).stat().st_size != f.size:
                return None
        except OSError:
            return None
    return Snapshot(cache, record, snap, reused=True)

def cached_ref(cache: Path, repo: str, revision: str) -> str | None:
    """The commit a branch or tag pointed to when it was last pulled."""
    try:
        return layout.cache_ref_path(cache, repo, revision).read_text().strip() or None
    except (FileNotFoundError, OSError, ValueError):
        return None


def write_record(cache: Path, repo: str, commit: str, record: PullRecord) -> None:
    """Keep the record of a verified snapshot (atomically)."""
    path = layout.pull_record_path(cache, repo, commit)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(path, record.model_dump_json(indent=2).encode())


def write_ref(cache: Path, repo: str, revision: str, commit: str) -> None:
    """Remember the commit a branch or tag named (full commits and unsafe names are not refs)."""
    if is_commit(revision) or unsafe_reason(revision):
        return
    ref = layout.cache_ref_path(cache, repo, revision)
    ref.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(ref, commit.encode())


def publish_snapshot(cache: Path, repo: str, commit: str, files: Sequence[SourceFile]) -> Path:
    """The snapshot directory of `commit`: one relative link per file to its blob, made whole in a temporary
    directory and renamed into place (a reader sees all of it or none; a concurrent maker's copy wins)."""
    snap = layout.cache_snapshot_dir(cache, repo, commit)
    if snap.is_dir():
        return snap
    blobs = layout.cache_blobs_dir(cache, repo)
    stage = atomic.temp_name(snap, "snap")
    for sf in files:
        link = stage / sf.path
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blobs / sf.sha256, link.parent), link)
    try:
        os.rename(stage, snap)
    except OSError:
        shutil.rmtree(stage, ignore_errors=True)
        if not snap.is_dir():
            raise
    return snap
