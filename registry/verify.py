"""Re-verify what the store holds against the digests in the manifests, offline."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from registry import layout
from registry.digest import sha256_file
from registry.progress import NoProgress, Progress
from registry.store import LocalStore, Version


@dataclass(frozen=True)
class VerifyReport:
    """The outcome of verifying one version."""

    name: str
    version: int
    files: int
    bytes: int
    problems: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        """Whether every file matched."""
        return not self.problems


def verify_version(store: LocalStore, version: Version, progress: Progress | None = None) -> VerifyReport:
    """Re-hash every file of a version (and its blob), report every mismatch, missing or extra file."""
    progress = progress or NoProgress()
    root = Path(version.path)
    problems: list[str] = []
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
            if p.is_symlink() or not p.is_file():
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
            try:
                bst = blob.stat()
            except FileNotFoundError:
                problems.append(f"{rel}: blob {f.sha256[:12]}… missing from the store")
                continue
            if (bst.st_dev, bst.st_ino) != (st.st_dev, st.st_ino) and sha256_file(blob) != f.sha256:
                problems.append(f"blob {f.sha256[:12]}…: content does not match its name")
    progress.done()
    for dirpath, _dirs, files in os.walk(root):
        for fn in files:
            rel = (Path(dirpath) / fn).relative_to(root).as_posix()
            if rel not in expected:
                problems.append(f"{rel}: not in the manifest")
    return VerifyReport(version.name, version.number, count, total, tuple(problems))
