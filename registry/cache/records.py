"""What mreg verified: pull records beside huggingface_hub's cache, and the snapshots they describe.

Layout (huggingface_hub's, plus mreg's records; names in `registry.layout`)::

    <cache>/
      models--org--name/blobs/<etag>            file contents
      models--org--name/snapshots/<commit>/…    symlinks into blobs
      models--org--name/refs/<branch>           the commit a branch pointed to
      models--org--name/.mreg/<commit>.json     what mreg verified (a PullRecord), unseen by the hub's scanner

A local directory imported without a copy (`PullRecord.linked`) has a snapshot of absolute links to
the directory's own files and no blobs: its record is trusted only while every file keeps the size,
times, device and inode it was hashed with (`identity`); a change makes the snapshot unusable, never
silently different.
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
from registry.errors import IntegrityError

#: What identifies a file's bytes without reading them: (size, mtime_ns, ctime_ns, device, inode). A write
#: moves ctime, which no user can set back; a replacement by rename changes the inode.
Identity = tuple[int, int, int, int, int]


def identity(path: Path) -> Identity:
    """The identity of the file `path` names (links followed)."""
    st = path.stat()
    return st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_dev, st.st_ino


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

    @property
    def linked(self) -> bool:
        """Whether the files are a local directory's own (to be copied, never hard-linked, into a store)."""
        return self.record.linked

    def check_unchanged(self) -> None:
        """Raise IntegrityError when a linked snapshot's file changed since it was hashed (for a snapshot of
        copies there is nothing to check: its blobs are the cache's own)."""
        changed = _changed(self.path, self.record)
        if changed:
            raise IntegrityError(
                f"{changed} in {self.record.source.requested_revision} changed while mreg was using it "
                "(it was hashed before); nothing was published",
                hint="run the command again once nothing writes to the directory, or with --copy to work from "
                     "a copy in the cache")

def load_record(cache: Path, repo: str, commit: str) -> Snapshot | None:
    """A previously verified snapshot whose files are all still present, if any."""
    path = layout.pull_record_path(cache, repo, commit)
    _adopt_legacy(cache, repo, commit, path)
    try:
        record = PullRecord.model_validate_json(path.read_bytes())
    except (OSError, ValueError):
        return None
    snap = layout.cache_snapshot_dir(cache, repo, commit)
    for f in record.source.files:
        try:
            if (snap / f.path).stat().st_size != f.size:
                return None
        except OSError:
            return None
    if _changed(snap, record):
        return None
    return Snapshot(cache, record, snap, reused=True)


def _adopt_legacy(cache: Path, repo: str, commit: str, path: Path) -> None:
    """Move a record an older mreg kept at the cache's top into the repository's folder (a rename: a reader sees
    it in one place or the other), and drop the old folders once empty, so `hf cache ls` stops calling them
    corrupt. Best effort: a record that cannot be moved is not read, and the snapshot is verified again."""
    old = layout.legacy_pull_record_path(cache, repo, commit)
    if path.exists() or not old.is_file() or not path.parent.parent.is_dir():
        return
    try:
        path.parent.mkdir(exist_ok=True)
        os.replace(old, path)
        for folder in (old.parent, old.parent.parent, old.parent.parent.parent):
            folder.rmdir()
    except OSError:
        return


def _changed(snap: Path, record: PullRecord) -> str | None:
    """The first file of a linked snapshot that is gone or no longer what was hashed, if any."""
    if not record.linked:
        return None
    for f in record.source.files:
        try:
            if identity(snap / f.path) != record.local_stat.get(f.path):
                return f.path
        except OSError:
            return f.path
    return None

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


def publish_snapshot(cache: Path, repo: str, commit: str, files: Sequence[SourceFile],
                     origin: Path | None = None) -> Path:
    """The snapshot directory of `commit`: one link per file, to its blob (relative), or with `origin` to the
    file of that directory (absolute). Made whole in a temporary directory and renamed into place (a reader
    sees all of it or none); when it exists, each link that leads elsewhere is replaced atomically (a link
    and its replacement hold the same bytes: the commit names them)."""
    snap = layout.cache_snapshot_dir(cache, repo, commit)
    blobs = layout.cache_blobs_dir(cache, repo)

    def target(sf: SourceFile, parent: Path) -> str:
        return str(origin / sf.path) if origin is not None else os.path.relpath(blobs / sf.sha256, parent)

    if snap.is_dir():
        for parent in {(snap / sf.path).parent for sf in files}:
            atomic.sweep(parent, "link")  # what a flip killed between its symlink and its rename left
        for sf in files:
            link = snap / sf.path
            want = target(sf, link.parent)
            try:
                if os.readlink(link) == want:
                    continue
            except OSError:
                pass
            link.parent.mkdir(parents=True, exist_ok=True)
            tmp = atomic.temp_name(link, "link")
            os.symlink(want, tmp)
            os.replace(tmp, link)
        return snap
    stage = atomic.temp_name(snap, "snap")
    for sf in files:
        link = stage / sf.path
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target(sf, link.parent), link)
    try:
        os.rename(stage, snap)
    except OSError:
        shutil.rmtree(stage, ignore_errors=True)
        if not snap.is_dir():
            raise
        return publish_snapshot(cache, repo, commit, files, origin)
    return snap
