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
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from manifests import CheckRecord, HistoryEntry, Manifest, RolloutRecord, SignatureRecord
from registry import atomic, layout
from registry.digest import file_chunks, sha256_file, write_hashed
from registry.errors import Conflict, IntegrityError, ModelNotFound, UsageError, VersionNotFound
from registry.progress import Progress
from registry.refs import Ref
from registry.store import entries
from registry.store.lease import FileSlot
from registry.store.protocol import (
    AliasDecision,
    Listener,
    RolloutChange,
    RolloutDecision,
    Version,
    first_of,
    manifest_bytes,
    read_manifest,
    resolve_ref,
    tell,
)
from registry.store.staging import Staging


class LocalStore:
    """A store on a local (or network) filesystem."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().absolute()
        self.location = str(self.root)
        self.tmp = layout.tmp_dir(self.root)
        self.listeners: list[Listener] = []

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
        """Published version numbers of a model, ascending; IntegrityError naming an entry of `versions/` that is
        not a version mreg wrote (a reader given a wrong list would answer for the wrong version)."""
        published, _taken, strays = entries.scan_versions(self.root, name)
        if strays:
            raise first_of(strays)
        return published

    def survey(self, name: str) -> tuple[list[int], list[IntegrityError]]:
        """The published versions a reader can go on with, and every entry of the model that mreg did not write
        there (named, not raised): what `list` and `verify --all` report beside the good versions."""
        try:  # a model directory that is a link: nothing under it is the store's to list
            atomic.require_no_link(self.root, layout.model_dir(self.root, name), f"model {name}")
        except IntegrityError as e:
            return [], [e]
        published, _taken, strays = entries.scan_versions(self.root, name)
        records = [e for kind in (layout.SIGNATURES, layout.CHECKS)
                   for e in entries.record_strays(self.root, name, kind)]
        return published, entries.model_strays(self.root, name, lambda a: self.alias(name, a)) + strays + records

    def _taken_numbers(self, name: str) -> list[int]:
        """Every number a publish must not take: a removed version's stays taken, and so does a stray's."""
        return entries.scan_versions(self.root, name)[1]

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
        """One published version (IntegrityError when a link leads out of its place, when something else stands
        where its directory or manifest belongs, or when its manifest names another version)."""
        path = self.checked_version_dir(name, number)
        manifest_path = path / layout.MANIFEST
        try:
            st = os.lstat(manifest_path)
        except FileNotFoundError:
            if not layout.model_dir(self.root, name).is_dir():
                raise ModelNotFound(name) from None
            raise VersionNotFound(name, str(number)) from None
        except NotADirectoryError:
            raise atomic.not_ours(path, f"the directory of {name}@{number}") from None
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read, a directory fail it
            raise atomic.not_ours(manifest_path, f"the manifest of {name}@{number}")
        if st.st_size > MANIFEST_MAX_BYTES:
            raise IntegrityError(f"{manifest_path} is {st.st_size} bytes: no manifest mreg writes is over "
                                 f"{MANIFEST_MAX_BYTES >> 20} MiB", hint=_MANIFEST_HINT)
        data = manifest_path.read_bytes()
        manifest = read_manifest(data, name, number, str(manifest_path), hint=_MANIFEST_HINT)
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
        """Every alias of a model and the version it points to; IntegrityError at an alias's name that holds
        anything but a link to a version, and at a link where mreg keeps a directory of its own (`checks`)."""
        d = layout.model_dir(self.root, name)
        out: dict[str, int] = {}
        try:
            names = sorted(os.listdir(d))
        except (FileNotFoundError, NotADirectoryError):
            return out
        for entry in names:
            if entry in layout.MODEL_DIRS:
                atomic.require_no_link(self.root, d / entry, f"the {entry} directory of {name}")
            elif entries.is_alias_name(entry):
                n = self.alias(name, entry)
                if n is not None:
                    out[entry] = n
        return out

    def alias(self, name: str, alias: str) -> int | None:
        """The version an alias points to, if it exists; an alias whose link names anything but one of the model's
        versions (a path out of the store, say), or that is not a link at all, is an IntegrityError: an engine
        mounting it would serve that, and gc would not know which version it keeps."""
        if alias in layout.RESERVED_ALIASES:
            return None  # `m@versions` names no alias: the directory there is mreg's own
        path = layout.alias_path(self.root, name, alias)
        try:
            target = os.readlink(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise  # EACCES: the CLI says which path it could not read (exit 1), never "does not exist"
            raise atomic.not_ours(path, f"alias {alias} of {name} (a symlink to versions/N)") from None
        number = layout.parse_alias_target(target)
        if number is None:
            raise IntegrityError(f"alias {alias} of {name} is a symlink to {target}, not to a version of the store",
                                 hint=f"remove the link ({path}) and promote a version again")
        return number

    def history(self, name: str) -> list[HistoryEntry]:
        """Every recorded alias change of a model, oldest first; a damaged log is an IntegrityError."""
        path = layout.model_dir(self.root, name) / layout.HISTORY
        try:
            lines = entries.read_regular(path).decode("utf-8").splitlines()
        except FileNotFoundError:
            return []
        except PermissionError:
            raise
        except entries.NotRegular as e:
            raise _damaged_history(path, f"it is {e.strerror}") from None
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
        except PermissionError:
            raise
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
        """Every golden-check record of a version, oldest first; one that does not parse is an IntegrityError."""
        return self._records(layout.checks_dir(self.root, name, number), f"checks of {name}@{number}",
                             CheckRecord.model_validate_json)

    def signatures(self, name: str, number: int) -> list[SignatureRecord]:
        """Every signature record of a version, oldest first; one that does not parse is an IntegrityError."""
        return self._records(layout.signatures_dir(self.root, name, number), f"signatures of {name}@{number}",
                             SignatureRecord.model_validate_json)

    def _records(self, d: Path, what: str, parse: Callable[[bytes], _R]) -> list[_R]:
        """The records in one version's records directory, oldest first (their names start with the time)."""
        atomic.require_no_link(self.root, d, what)
        try:
            names = sorted(n for n in os.listdir(d) if n.endswith(".json"))
        except FileNotFoundError:
            return []
        except NotADirectoryError:  # the version's directory, or models/<name>/<kind> itself, is a file
            raise atomic.not_ours(d if d.exists() else d.parent, f"the directory of the {what}") from None
        out = []
        for n in names:
            p = d / n
            try:
                out.append(parse(entries.read_regular(p)))
            except ValueError as e:
                raise IntegrityError(f"{what}: record {p} does not parse: {str(e).splitlines()[0]}",
                                     hint="restore it from a backup, or move it out of the store (one record: "
                                          "the version itself is intact)") from None
            except entries.NotRegular:
                raise atomic.not_ours(p, f"a record of the {what}") from None
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
        if entry is not None:
            tell(self.listeners, name, entry)
        return current, entry

    def rollout(self, name: str, alias: str) -> RolloutRecord | None:
        """The rollout record of an alias; IntegrityError when it does not parse or names another alias."""
        path = layout.rollout_path(self.root, name, alias)
        atomic.require_no_link(self.root, path.parent, f"the rollouts of {name}")
        try:
            data = entries.read_regular(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except entries.NotRegular:
            raise atomic.not_ours(path, f"the rollout record of {name} {alias}") from None
        hint = ("restore it from a backup, or move it out of the store: the aliases are intact (the canary alias "
                f"{layout.canary_alias(alias)} may remain; remove it by hand)")
        try:
            rec = RolloutRecord.model_validate_json(data)
        except ValueError as e:
            raise IntegrityError(f"the rollout record {path} does not parse: {str(e).splitlines()[0]}",
                                 hint=hint) from None
        if (rec.name, rec.alias) != (name, alias):
            raise IntegrityError(f"{path} says it is the rollout of {rec.name} {rec.alias}", hint=hint)
        return rec

    def transact_rollout(self, name: str, alias: str, decide: RolloutDecision
                         ) -> tuple[int | None, RolloutRecord | None, RolloutChange | None]:
        """Under the model's lock: decide, write the record (the commit), flip the alias if the entry moves it,
        append the entry. A crash after the record is repaired from it (`registry.release.rollout.settle`)."""
        if not layout.model_dir(self.root, name).is_dir():
            raise ModelNotFound(name)
        atomic.require_no_link(self.root, layout.model_dir(self.root, name), f"model {name}")
        with self.alias_lock(name):
            current = self._reconciled(name, alias)
            before = self.rollout(name, alias)
            change = decide(current, before, lambda: self.history(name))
            if change is not None:
                path = layout.rollout_path(self.root, name, alias)
                path.parent.mkdir(exist_ok=True)
                atomic.require_no_link(self.root, path.parent, f"the rollouts of {name}")
                atomic.write_bytes(path, change.record.model_dump_json(by_alias=True).encode() + b"\n")
                if change.entry is not None:
                    if change.entry.to_version != current:
                        self.set_alias(name, alias, change.entry.to_version)
                    self.append_history(name, change.entry)
        if change is not None and change.entry is not None:
            tell(self.listeners, name, change.entry)
        return current, before, change

    def keep_undelivered(self, record: dict[str, object]) -> str:
        """Append the undelivered event to `events/undelivered.jsonl` (one line each, appended whole)."""
        import json

        path = layout.undelivered_log(self.root)
        path.parent.mkdir(exist_ok=True)
        atomic.require_no_link(self.root, path, "the undelivered events")
        atomic.append_line(path, json.dumps(record, sort_keys=True, default=str))
        return str(path)

    def point_alias(self, name: str, alias: str, number: int) -> None:
        """Point a rollout's canary alias at a version (a symlink flip, under the model's lock)."""
        with self.alias_lock(name):
            self.set_alias(name, alias, number)

    def drop_alias(self, name: str, alias: str) -> None:
        """Remove a rollout's canary alias (only a link mreg made; absent is fine)."""
        dest = layout.alias_path(self.root, name, alias)
        with self.alias_lock(name):
            if dest.is_symlink():
                dest.unlink()
                atomic.fsync_dir(dest.parent)
            elif dest.exists():
                raise UsageError(f"{dest} exists and is not an alias symlink", hint="move it out of the store")

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
                if e.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):  # ENOTDIR: a file stands there
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
        atomic.require_no_link(self.root, vdir, f"model {name}")
        if vdir.exists() and not vdir.is_dir():
            raise atomic.not_ours(vdir, f"the versions directory of {name}")
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
            if not sub.is_dir():
                if len(sub.name) == 2:
                    raise atomic.not_ours(sub, "a directory of blobs")
                continue
            for p in sorted(sub.iterdir()):
                if len(p.name) == 64 and not p.name.startswith("."):
                    if p.is_symlink() or not p.is_file():  # gc would unlink(2) it, verify read it
                        raise atomic.not_ours(p, "a blob (a read-only file named by its sha256)")
                    yield p.name, p


def _same_file(a: Path, b: Path) -> bool:
    sa, sb = a.stat(), b.stat()
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _fsync_tree_dirs(root: Path) -> None:
    for dirpath, _dirs, _files in os.walk(root):
        atomic.fsync_dir(Path(dirpath))


#: No manifest mreg writes comes near this (one of a thousand files is about 200 KiB): more is not a manifest,
#: and reading it whole would be the first thing an intruder's huge file costs.
MANIFEST_MAX_BYTES = 64 << 20
_MANIFEST_HINT = ("mreg never rewrites a manifest: restore the version from a backup or a remote store, or move it "
                  "out of the store; then run `mreg verify --all`")
_R = TypeVar("_R")


def _damaged_history(path: Path, why: str) -> IntegrityError:
    return IntegrityError(f"the alias history {path} is damaged: {why}",
                          hint="restore it from a backup (aliases themselves are intact; rollback and gc need "
                               "the history); nothing was changed")
