"""Re-verify what a store holds against the digests in its manifests: local files re-hashed offline, S3
blobs downloaded and hashed."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from registry import atomic, layout
from registry.digest import sha256_file
from registry.errors import IntegrityError
from registry.progress import NoProgress, Progress
from registry.store.local import LocalStore
from registry.store.parallel import parallel
from registry.store.protocol import Store, Version

if TYPE_CHECKING:
    from registry.store.s3 import S3Store


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of verifying one version."""

    name: str
    version: int
    files: int
    bytes: int
    problems: tuple[str, ...] = field(default=())
    #: The problems that are symlinks where the version keeps files (also in `problems`): mreg follows none.
    links: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """Whether every file matched."""
        return not self.problems


def verify_version(store: LocalStore, version: Version, progress: Progress | None = None) -> VerifyReport:
    """Re-hash every file of a version (and its blob), report every mismatch, missing or extra file."""
    progress = progress or NoProgress()
    root = Path(version.path)
    problems: list[str] = []
    links: list[str] = []
    expected: set[str] = {layout.MANIFEST}
    total = sum(f.size for a in version.manifest.artifacts for f in a.files)
    progress.start(f"verifying {version.name}@{version.number}", total)
    count = 0
    for art in version.manifest.artifacts:
        for f in art.files:
            rel = f"{art.path}/{f.path}"
            expected.add(rel)
            count += 1
            p = root / rel
            link = atomic.first_link(store.root, p)
            if link is not None:  # hashing it would vouch for bytes that are not the store's
                links.append(f"{rel}: {atomic.describe_link(store.root, link)}, not a file of the version")
                continue
            if not p.is_file():
                problems.append(f"{rel}: missing")
                continue
            st = p.stat()
            if st.st_size != f.size:
                problems.append(f"{rel}: size {st.st_size}, manifest says {f.size}")
                progress.advance(f.size)
                continue
            actual = sha256_file(p, progress.advance)
            if actual != f.sha256:
                problems.append(f"{rel}: sha256 {actual[:12]}…, manifest says {f.sha256[:12]}…")
            blob = layout.blob_path(store.root, f.sha256)
            if (link := atomic.first_link(store.root, blob)) is not None:
                links.append(f"blob {f.sha256[:12]}…: {atomic.describe_link(store.root, link)}")
                continue
            try:
                bst = blob.lstat()
            except FileNotFoundError:
                problems.append(f"{rel}: blob {f.sha256[:12]}… missing from the store")
                continue
            if not stat.S_ISREG(bst.st_mode):  # hashing a directory fails, reading a FIFO blocks
                problems.append(f"blob {f.sha256[:12]}…: {blob} is {atomic.kind(blob)}, not a file")
                continue
            if (bst.st_dev, bst.st_ino) != (st.st_dev, st.st_ino) and sha256_file(blob) != f.sha256:
                problems.append(f"blob {f.sha256[:12]}…: content does not match its name")
    progress.done()
    # Directories on the way to the manifest's files: a link there was reported through each of its files.
    on_the_way = {d.as_posix() for rel in expected for d in PurePosixPath(rel).parents}
    for dirpath, dirs, files in os.walk(root):  # walk does not follow links to directories: report them
        for fn in files + dirs:
            p = Path(dirpath) / fn
            rel = p.relative_to(root).as_posix()
            if rel in expected or rel in on_the_way:
                continue
            if p.is_symlink():
                links.append(f"{rel}: {atomic.describe_link(store.root, p)}, not in the manifest")
            elif fn in files:
                problems.append(f"{rel}: not in the manifest")
    return VerifyReport(version.name, version.number, count, total, tuple(problems + links), tuple(links))


def unreadable(name: str, number: int, error: IntegrityError) -> VerifyReport:
    """The report of a version whose reading already failed its integrity checks (a link out of its place)."""
    is_link = bool(error.details and "link" in error.details)
    return VerifyReport(name, number, 0, 0, (str(error),), (str(error),) if is_link else ())


def verify(store: Store, version: Version, progress: Progress | None = None) -> VerifyReport:
    """Verify one version of any store: re-hash local files, or download and hash remote blobs."""
    if isinstance(store, LocalStore):
        return verify_version(store, version, progress)
    from registry.store.s3 import S3Store

    assert isinstance(store, S3Store), f"no verification for {type(store).__name__}"
    return verify_remote(store, version)


def verify_remote(remote: S3Store, version: Version, workers: int = 8) -> VerifyReport:
    """Download and hash every blob of a remote version."""
    files = {f.sha256: (f"{a.path}/{f.path}", f.size) for a in version.manifest.artifacts for f in a.files}

    def check(d: str) -> str | None:
        rel, size = files[d]
        opened = remote.open(remote.blob_key(d), f"reading blob {d[:12]}… from {remote.location}")
        if opened is None:
            return f"{rel}: blob {d[:12]}… missing"
        h = hashlib.sha256()
        n = 0
        for chunk in opened[0]:  # a dropped connection says nothing about the blob: no verdict, an error
            h.update(chunk)
            n += len(chunk)
        if n != size or h.hexdigest() != d:
            return f"{rel}: blob {d[:12]}… is corrupt (size {n}, sha256 {h.hexdigest()[:12]}…)"
        return None

    problems = tuple(p for p in parallel(workers, check, list(files)) if p)
    return VerifyReport(version.name, version.number, len(files), sum(s for _, s in files.values()), problems)
