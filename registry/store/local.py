"""The store: content-addressed blobs, immutable numbered versions, alias symlinks.

The layout is drawn in `registry.layout`. Invariants:

* a blob's name is its sha256; it is written under a temp name, verified, then hard-linked
  into place (`link(2)` never overwrites, so a blob is complete or absent);
* a version is staged in `tmp/` and published by `rename(2)` of the whole tree onto
  `versions/<n>`, which fails if `<n>` exists: that is how numbers are allocated without a
  global lock, and why no reader ever sees a partial version;
* an alias is a relative symlink replaced by `rename(2)` of a fresh symlink over it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

from manifests import CheckRecord, HistoryEntry, Manifest, SignatureRecord
from registry import atomic, layout
from registry.digest import file_chunks, sha256_file, write_hashed
from registry.errors import Conflict, IntegrityError, ModelNotFound, UsageError, VersionNotFound
from registry.progress import Progress
from registry.refs import Ref
from registry.store.lease import FileSlot
from registry.store.protocol import AliasDecision, Version, manifest_bytes, resolve_ref
from registry.store.staging import Staging


class LocalStore:
    """A store on a local (or network) filesystem."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().absolute()
        self.location = str(self.root)
        self.tmp = layout.tmp_dir(self.root)

    # -- reading -------------------------------------------------------------------------

    def is_store(self) -> bool:
        """Whether the root is a directory."""
        return self.root.is_dir()

    def models(self) -> list[str]:
        """Names of the models in the store."""
        d = self.root / layout.MODELS
        if not d.is_dir():
            return []
        return sorted(p.name for p in d.iterdir() if p.is_dir() and layout.NAME_RE.match(p.name))

    def versions(self, name: str) -> list[int]:
        """Published version numbers of a model, ascending."""
        d = layout.versions_dir(self.root, name)
        if not d.is_dir():
            return []
        out = []
        for p in d.iterdir():
            if p.name.isdigit() and (p / layout.MANIFEST).is_file():
                out.append(int(p.name))
        return sorted(out)

    def _taken_numbers(self, name: str) -> list[int]:
        d = layout.versions_dir(self.root, name)
        return sorted(int(p.name) for p in d.iterdir() if p.name.isdigit()) if d.is_dir() else []

    def checked_version_dir(self, name: str, number: int) -> Path:
        """A version's directory, proven to be where it seems: no symlink on the way, at its manifest or inside it.

        mreg never makes a link there (files are hard links to blobs), so one is tampering or a mistake, and
        following it would read, serve or delete what is not the store's.
        """
        vdir = layout.version_dir(self.root, name, number)
        what = f"{name}@{number}"
        atomic.require_no_link(self.root, vdir / layout.MANIFEST, what)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for child in vdir.iterdir():
                atomic.require_no_link(self.root, child, what)
        return vdir

    def version(self, name: str, number: int) -> Version:
        """One published version (IntegrityError when a link leads out of its place)."""
        path = self.checked_version_dir(name, number)
        try:
            data = (path / layout.MANIFEST).read_bytes()
        except FileNotFoundError:
            if not layout.model_dir(self.root, name).is_dir():
                raise ModelNotFound(name) from None
            raise VersionNotFound(name, str(number)) from None
        try:
            manifest = Manifest.model_validate_json(data)
        except ValueError as e:
            raise IntegrityError(
                f"{name}@{number}: manifest does not parse: {str(e).splitlines()[0]}",
                hint=f"run `mreg verify {name}@{number}`",
            ) from e
        for art in manifest.artifacts:  # nested artifact paths: every directory on the way
            atomic.require_no_link(self.root, path / art.path, f"{name}@{number}")
        return Version(name, number, manifest, hashlib.sha256(data).hexdigest(), str(path))

    def resolve(self, ref: Ref) -> Version:
        """The version a reference names: number, alias, `latest` or manifest digest prefix."""
        return resolve_ref(self, ref)

    def has_model(self, name: str) -> bool:
        """Whether the store knows this model."""
        return layout.model_dir(self.root, name).is_dir()

    def aliases(self, name: str) -> dict[str, int]:
        """Every alias of a model and the version it points to."""
        d = layout.model_dir(self.root, name)
        out: dict[str, int] = {}
        if d.is_dir():
            for p in d.iterdir():
                if p.is_symlink() and layout.ALIAS_RE.match(p.name):
                    n = self.alias(name, p.name)  # a link to anything but a version is an IntegrityError
                    if n is not None:
                        out[p.name] = n
        return dict(sorted(out.items()))

    def alias(self, name: str, alias: str) -> int | None:
        """The version an alias points to, if it exists; an alias whose link names anything but one of the model's
        versions (a path out of the store, say) is an IntegrityError: an engine mounting it would serve that."""
        path = layout.alias_path(self.root, name, alias)
        try:
            target = os.readlink(path)
        except OSError:  # no such alias (or not a link: aliases are only ever links)
            return None
        number = layout.parse_alias_target(target)
        if number is None:
            raise IntegrityError(f"alias {alias} of {name} is a symlink to {target}, not to a version of the store",
                                 hint=f"remove the link ({path}) and promote a version again")
        return number

    def history(self, name: str) -> list[HistoryEntry]:
        """Every recorded alias change of a model, oldest first; a damaged log is an IntegrityError."""
        path = layout.model_dir(self.root, name) / layout.HISTORY
        try:
            lines = path.read_bytes().decode("utf-8").splitlines()
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError) as e:
            raise _damaged_history(path, f"it cannot be read as text ({type(e).__name__})") from None
        out = []
        for line in lines:
            if line.strip():
                try:
                    out.append(HistoryEntry.model_validate_json(line))
                except ValueError:
                    continue  # a line torn by a crash (the next append starts after it): never acknowledged
        return out

    def last_entry(self, name: str, alias: str) -> HistoryEntry | None:
        """The newest history entry of one alias, reading only the end of the file when it can."""
        path = layout.model_dir(self.root, name) / layout.HISTORY
        try:
            with open(path, "rb") as f:
                size = f.seek(0, os.SEEK_END)
                f.seek(max(0, size - 65536))
                tail = f.read()
        except FileNotFoundError:
            return None
        except OSError as err:
            raise _damaged_history(path, f"it cannot be read ({type(err).__name__})") from None
        lines = tail.splitlines()
        if size > 65536:
            lines = lines[1:]  # the first line may be cut
        for line in reversed(lines):
            try:
                e = HistoryEntry.model_validate_json(line)
            except ValueError:
                continue
            if e.alias == alias:
                return e
        if size > 65536:
            return next((e for e in reversed(self.history(name)) if e.alias == alias), None)
        return None

    def find_by_key(self, name: str, key: str) -> Version | None:
        """The oldest version made from exactly these inputs, if any."""
        for n in self.versions(name):
            v = self.version(name, n)
            if v.manifest.key == key:
                return v
        return None

    # -- writing -------------------------------------------------------------------------

    def alias_mount(self, name: str, alias: str) -> str | None:
        """The alias symlink's path: it follows promotions and rollbacks."""
        return str(layout.alias_path(self.root, name, alias))

    def files_dir(self, version: Version) -> Path | None:
        """The version directory."""
        return Path(version.path)

    def check_records(self, name: str, number: int) -> list[CheckRecord] | None:
        """Every golden-check record of a version, oldest first."""
        d = layout.checks_dir(self.root, name, number)
        if not d.is_dir():
            return []
        return [CheckRecord.model_validate_json(p.read_bytes()) for p in sorted(d.glob("*.json"))]

    def signatures(self, name: str, number: int) -> list[SignatureRecord]:
        """Every signature record of a version, oldest first; one that does not parse is an IntegrityError."""
        d = layout.signatures_dir(self.root, name, number)
        if not d.is_dir():
            return []
        atomic.require_no_link(self.root, d, f"signatures of {name}@{number}")
        out = []
        for p in sorted(d.glob("*.json")):
            try:
                out.append(SignatureRecord.model_validate_json(p.read_bytes()))
            except ValueError as e:
                raise IntegrityError(f"signature record {p} does not parse: {str(e).splitlines()[0]}",
                                     hint="restore it from a backup, or remove it (one signer's record)") from None
        return out

    def alias_lock(self, name: str) -> contextlib.AbstractContextManager[object]:
        """Serialize alias writers of one model (flock on the model's lock file)."""
        return atomic.flock(layout.model_dir(self.root, name) / layout.ALIAS_LOCK)

    def transact_alias(self, name: str, alias: str, decide: AliasDecision) -> tuple[int | None, HistoryEntry | None]:
        """Under the model's lock: reconcile, decide, flip the symlink, append the history entry."""
        if not layout.model_dir(self.root, name).is_dir():
            raise ModelNotFound(name)
        atomic.require_no_link(self.root, layout.model_dir(self.root, name), f"model {name}")
        with self.alias_lock(name):
            current = self._reconciled(name, alias)
            entry = decide(current, lambda: self.history(name))
            if entry is not None:
                self.set_alias(name, alias, entry.to_version)
                self.append_history(name, entry)
        return current, entry

    def _reconciled(self, name: str, alias: str) -> int | None:
        """The alias's target; if a crashed writer flipped it without recording, record that first."""
        from registry import provenance

        current = self.alias(name, alias)
        if current is None:
            return None
        last = self.last_entry(name, alias)
        if last is None or last.to_version != current:
            self.append_history(name, HistoryEntry.model_validate({
                "alias": alias, "action": "repair", "from": last.to_version if last else None, "to": current,
                "reason": "alias found pointing here without a history entry (interrupted writer); recorded",
                "by": provenance.now(),
            }))
        return current

    def set_alias(self, name: str, alias: str, number: int) -> None:
        """Atomically point an alias at a version: new symlink under a temp name, rename over."""
        dest = layout.alias_path(self.root, name, alias)
        if dest.exists() and not dest.is_symlink():
            raise UsageError(f"{dest} exists and is not an alias symlink", hint="move it out of the store")
        atomic.sweep(dest.parent, "alias")  # what a killed flip left (callers hold the alias lock)
        tmp = atomic.temp_name(dest, "alias")
        os.symlink(layout.alias_target(number), tmp)
        try:
            os.replace(tmp, dest)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        atomic.fsync_dir(dest.parent)

    def append_history(self, name: str, entry: HistoryEntry) -> None:
        """Append one entry to a model's history (callers hold the alias lock)."""
        atomic.append_line(layout.model_dir(self.root, name) / layout.HISTORY,
                           entry.model_dump_json(by_alias=True))

    def writers(self) -> contextlib.AbstractContextManager[bool]:
        """Held (shared) by publishers while they ingest and publish; gc holds it exclusively."""
        return atomic.flock(self.root / layout.GC_LOCK, shared=True)

    def conversion_slot(self, name: str, key: str) -> FileSlot:
        """Where the lease of one conversion lives."""
        return FileSlot(self.root, name, key)

    def stage(self, name: str) -> Staging:
        """Start a staging tree for a new version of `name`."""
        return Staging(self, name)

    def place_blobs(self, wanted: dict[str, list[Path]]) -> None:
        """Put each blob at each of its paths in a staging tree: the first path holds the fetched bytes (made the
        blob here), the others become links to it."""
        for digest, paths in wanted.items():
            blob = layout.blob_path(self.root, digest)
            for p in paths:
                p.parent.mkdir(parents=True, exist_ok=True)
                if p.exists():
                    self.link_blob(p, digest, verify=False)
                else:
                    os.link(blob, p)

    def link_blob(self, src: Path, sha256: str, *, verify: bool) -> Path:
        """Make `src` (on this filesystem) the blob `sha256`, or replace it by a link to the existing blob."""
        dest = layout.blob_path(self.root, sha256)
        dest.parent.mkdir(parents=True, exist_ok=True)
        atomic.require_no_link(self.root, dest.parent, "blobs")
        if verify:
            actual = sha256_file(src)
            if actual != sha256:
                raise IntegrityError(f"{src.name}: sha256 {actual[:12]}… does not match {sha256[:12]}…")
        if not dest.exists():
            atomic.fsync_file(src)
            os.chmod(src, 0o444)
            try:
                os.link(src, dest)
            except FileExistsError:
                pass
            except OSError as e:
                atomic.raise_if_full(e, dest.parent)
                raise
            else:
                atomic.fsync_dir(dest.parent)
                return dest
        if not _same_file(src, dest):
            tmp = atomic.temp_name(src, "link")
            os.link(dest, tmp)
            os.replace(tmp, src)
        return dest

    def add_blob_copy(self, src: Path, dest_in_stage: Path, expected_sha256: str | None, progress: Progress) -> str:
        """Copy `src` into the staging tree while hashing it; checks the digest when one is expected."""
        dest_in_stage.parent.mkdir(parents=True, exist_ok=True)
        try:
            digest = write_hashed(dest_in_stage, file_chunks(src), progress.advance)
        except OSError as e:
            atomic.raise_if_full(e, dest_in_stage.parent)
            raise
        if expected_sha256 is not None and digest != expected_sha256:
            dest_in_stage.unlink()
            raise IntegrityError(
                f"cached file {src} changed since it was pulled: sha256 is {digest[:12]}…, "
                f"the pull recorded {expected_sha256[:12]}…",
                hint="remove the damaged snapshot from the cache and run `mreg pull` again",
            )
        return digest

    def publish(self, staging: Staging, manifest: Manifest) -> Version:
        """Write the manifest into the staging tree and rename it onto the next free version number."""
        vdir = self._versions_dir(staging.name)
        _fsync_tree_dirs(staging.path)
        taken = self._taken_numbers(staging.name)
        number = (taken[-1] + 1) if taken else 1
        while True:
            final = manifest.model_copy(update={"version": number})
            data = manifest_bytes(final)
            atomic.write_bytes(staging.path / layout.MANIFEST, data, mode=0o444)
            try:
                os.rename(staging.path, vdir / str(number))
            except OSError as e:
                if e.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    number += 1
                    continue
                raise
            break
        atomic.fsync_dir(vdir)
        staging.release()
        return Version(staging.name, number, final, hashlib.sha256(data).hexdigest(),
                       str(vdir / str(number)))

    def publish_exact(self, staging: Staging, manifest_raw: bytes, number: int) -> Version:
        """Publish a staging tree under a given number with these exact manifest bytes (mirroring a remote)."""
        vdir = self._versions_dir(staging.name)
        atomic.write_bytes(staging.path / layout.MANIFEST, manifest_raw, mode=0o444)
        _fsync_tree_dirs(staging.path)
        try:
            os.rename(staging.path, vdir / str(number))
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
            if self.version(staging.name, number).manifest_sha256 != hashlib.sha256(manifest_raw).hexdigest():
                raise Conflict(f"the local store already has a different {staging.name}@{number}",
                               hint="mirror a remote store into a local store used only for that") from e
            staging.discard()
            return self.version(staging.name, number)
        atomic.fsync_dir(vdir)
        staging.release()
        return self.version(staging.name, number)

    def _versions_dir(self, name: str) -> Path:
        """A model's versions directory, created if needed and proven to be inside the store (publish renames there)."""
        vdir = layout.versions_dir(self.root, name)
        vdir.mkdir(parents=True, exist_ok=True)
        return atomic.require_no_link(self.root, vdir, f"model {name}")

    def blob_digests(self) -> Iterator[tuple[str, Path]]:
        """Every blob in the store, with its path (IntegrityError at a blob directory that is a symlink)."""
        d = layout.blobs_dir(self.root)
        if not d.is_dir():
            return
        atomic.require_no_link(self.root, d, "blobs")
        for sub in sorted(d.iterdir()):
            atomic.require_no_link(self.root, sub, "blobs")
            if sub.is_dir():
                for p in sorted(sub.iterdir()):
                    if len(p.name) == 64 and not p.name.startswith("."):
                        yield p.name, p


def _same_file(a: Path, b: Path) -> bool:
    sa, sb = a.stat(), b.stat()
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _fsync_tree_dirs(root: Path) -> None:
    for dirpath, _dirs, _files in os.walk(root):
        atomic.fsync_dir(Path(dirpath))


def _damaged_history(path: Path, why: str) -> IntegrityError:
    return IntegrityError(f"the alias history {path} is damaged: {why}",
                          hint="restore it from a backup (aliases themselves are intact; rollback and gc need "
                               "the history); nothing was changed")
