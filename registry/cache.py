"""The cache: hub snapshots pinned to a commit, in huggingface_hub's own layout, verified by mreg.

Layout (huggingface_hub's, plus mreg's records)::

    <cache>/
      models--org--name/blobs/<etag>            file contents
      models--org--name/snapshots/<commit>/…    symlinks into blobs
      models--org--name/refs/<branch>           the commit a branch pointed to
      .mreg/pulls/models--org--name/<commit>.json   what mreg verified (a PullRecord)

`pull` = plan (what to fetch, is it safe, does it fit) then execute (download with
huggingface_hub, verify every file, write the record).
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from manifests import PullRecord, SourceFile, SourceInfo
from registry import atomic, layout, provenance
from registry.digest import file_chunks, hashes_file, sha256_file, write_hashed
from registry.errors import (
    HubUnavailable,
    InsufficientSpace,
    IntegrityError,
    MregError,
    NotFound,
    UnsafeInput,
    UsageError,
)
from registry.output import human_size
from registry.progress import NoProgress, Progress

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
SPACE_MARGIN = 64 << 20
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_REPO = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


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


@dataclass(frozen=True)
class RemoteFile:
    """A file as the hub describes it."""

    path: str
    size: int
    lfs_sha256: str | None
    blob_id: str | None


@dataclass(frozen=True)
class PullPlan:
    """What a pull will fetch and what it leaves out, decided before any byte is written."""

    repo: str
    commit: str
    selected: tuple[RemoteFile, ...]
    skipped_pickle: tuple[str, ...]
    skipped_filter: tuple[str, ...]
    missing_bytes: int
    free_bytes: int = 0
    warnings: tuple[str, ...] = field(default=())


def repo_folder(repo: str) -> str:
    """huggingface_hub's folder name for a model repository."""
    return "models--" + repo.replace("/", "--")


def is_commit(revision: str | None) -> bool:
    """Whether a revision is a full commit sha."""
    return bool(revision and _COMMIT.match(revision))


def check_repo_id(repo: str) -> str:
    """Refuse repository ids that are not `org/name` or `name`."""
    if not _REPO.match(repo) or ".." in repo:
        raise UsageError(f"bad repository id {repo!r}", hint="use ORG/NAME[@REVISION], or ./DIR for a local directory")
    return repo


def unsafe_reason(path: str) -> str | None:
    """Why a file name from a repository must not be written, or None when it is safe."""
    if not path or path.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", path):
        return "absolute path"
    if "\\" in path:
        return "backslash in path"
    if any(ord(c) < 32 for c in path):
        return "control character in path"
    parts = PurePosixPath(path).parts
    if any(p in ("..", ".") for p in path.split("/")) or not parts:
        return "path traversal"
    if any(p == ".git" or p.startswith(".mreg") for p in parts):
        return "reserved name"
    return None


def filtered_out(path: str, include: Sequence[str], exclude: Sequence[str]) -> bool:
    """Whether `--include` / `--exclude` leave a file out."""
    if include and not any(fnmatch.fnmatchcase(path, p) for p in include):
        return True
    return any(fnmatch.fnmatchcase(path, p) for p in exclude)


def plan_pull(
    repo: str,
    commit: str,
    files: Sequence[RemoteFile],
    *,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    allow_pickle: bool = False,
    present: Iterable[str] = (),
) -> PullPlan:
    """Decide what to fetch (pure): refuse unsafe names and pickle-only repos, apply filters."""
    bad = [(f.path, r) for f in files if (r := unsafe_reason(f.path))]
    if bad:
        listed = ", ".join(f"{p!r} ({r})" for p, r in bad[:5])
        raise UnsafeInput(
            f"{repo}@{commit[:12]} has file names that would escape the cache: {listed}",
            hint="nothing was written; this repository is not safe to mirror: report it to its owner",
        )
    selected, skipped_pickle, skipped_filter = [], [], []
    for f in files:
        if filtered_out(f.path, include, exclude):
            skipped_filter.append(f.path)
        elif f.path.lower().endswith(PICKLE_SUFFIXES) and not allow_pickle:
            skipped_pickle.append(f.path)
        else:
            selected.append(f)
    has_safe_weights = any(f.path.endswith((".safetensors", ".gguf", ".onnx")) for f in selected)
    if skipped_pickle and not has_safe_weights:
        raise UnsafeInput(
            f"{repo}@{commit[:12]} has only pickle weights ({', '.join(skipped_pickle[:3])}); "
            "loading them can run arbitrary code",
            hint="pick a revision with .safetensors weights, or pass --allow-pickle if you trust this repository",
        )
    present_set = set(present)
    missing = sum(f.size for f in selected if f.path not in present_set)
    return PullPlan(repo, commit, tuple(selected), tuple(skipped_pickle), tuple(skipped_filter), missing)


def check_space(plan: PullPlan, where: Path) -> PullPlan:
    """Refuse, with the numbers, a pull that will not fit on the cache's filesystem."""
    free = shutil.disk_usage(where).free
    if plan.missing_bytes + SPACE_MARGIN > free:
        raise InsufficientSpace(
            f"{plan.repo}@{plan.commit[:12]} needs {human_size(plan.missing_bytes)} "
            f"but {where} has {human_size(free)} free",
            hint="free space, choose a larger --cache-dir, or narrow the pull with --include/--exclude",
        )
    return PullPlan(**{**plan.__dict__, "free_bytes": free})


def load_record(cache: Path, repo: str, commit: str) -> Snapshot | None:
    """A previously verified snapshot whose files are all still present, if any."""
    folder = repo_folder(repo)
    path = layout.pull_record_path(cache, folder, commit)
    try:
        record = PullRecord.model_validate_json(path.read_bytes())
    except (FileNotFoundError, ValueError):
        return None
    snap = cache / folder / "snapshots" / commit
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
        return (cache / repo_folder(repo) / "refs" / revision).read_text().strip() or None
    except (FileNotFoundError, OSError, ValueError):
        return None


def pull_hub(
    cache: Path,
    repo: str,
    revision: str | None = None,
    *,
    endpoint: str | None = None,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    allow_pickle: bool = False,
    offline: bool = False,
    progress: Progress | None = None,
) -> Snapshot:
    """Download a hub repository at a revision into the cache, verify every file, pin the commit."""
    check_repo_id(repo)
    progress = progress or NoProgress()
    cache.mkdir(parents=True, exist_ok=True)
    wanted = revision or "main"
    if is_commit(wanted):
        hit = load_record(cache, repo, wanted)
        if hit is not None and _covers(hit, include, exclude, allow_pickle):
            return hit
    if offline:
        commit = wanted if is_commit(wanted) else cached_ref(cache, repo, wanted)
        hit = load_record(cache, repo, commit) if commit else None
        if hit is None:
            raise NotFound(
                f"{repo}@{wanted} is not in the cache {cache}",
                hint="run the same pull without --offline on a machine that reaches the hub",
            )
        return hit
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    api = HfApi(endpoint=endpoint)
    try:
        info = api.model_info(repo, revision=wanted, files_metadata=True)
    except RevisionNotFoundError as e:
        raise NotFound(f"revision {wanted!r} of {repo} does not exist", hint="check the branch, tag or commit") from e
    except GatedRepoError as e:
        raise NotFound(f"{repo} is gated", hint="accept its terms on the hub and set HF_TOKEN") from e
    except RepositoryNotFoundError as e:
        raise NotFound(
            f"repository {repo} does not exist (or is private)",
            hint="check the id; for a private repository set HF_TOKEN",
        ) from e
    except (httpx2.HTTPError, OSError) as e:
        commit = cached_ref(cache, repo, wanted)
        hit = load_record(cache, repo, commit) if commit else None
        if hit is not None:
            return hit
        raise HubUnavailable(
            f"cannot reach the hub for {repo}@{wanted}: {str(e).splitlines()[0]}",
            hint="check HF_ENDPOINT and the network, or use --offline with a revision already pulled",
        ) from e
    commit = info.sha
    if not commit or not is_commit(commit):
        raise HubUnavailable(f"the hub did not return a commit for {repo}@{wanted}", hint="retry later")
    hit = load_record(cache, repo, commit)
    if hit is not None and _covers(hit, include, exclude, allow_pickle):
        _write_ref(cache, repo, wanted, commit)
        return hit
    remote = [
        RemoteFile(
            s.rfilename,
            int(s.lfs.size if s.lfs else (s.size or 0)),
            s.lfs.sha256 if s.lfs else None,
            s.blob_id,
        )
        for s in (info.siblings or [])
    ]
    folder = cache / repo_folder(repo)
    present = _present_files(folder / "snapshots" / commit, remote)
    plan = plan_pull(repo, commit, remote, include=include, exclude=exclude, allow_pickle=allow_pickle,
                     present=present)
    plan = check_space(plan, cache)
    before = _blob_bytes(folder)
    snap_dir = folder / "snapshots" / commit
    files = _fetch_all(plan, cache, endpoint, snap_dir, progress)
    downloaded = max(_blob_bytes(folder) - before, 0)
    record = PullRecord(
        source=SourceInfo(kind="hub", repo=repo, requested_revision=wanted, commit=commit, endpoint=endpoint,
                          files=files),
        skipped=plan.skipped_pickle + plan.skipped_filter,
        pulled=provenance.now(),
    )
    _write_record(cache, repo_folder(repo), commit, record)
    _write_ref(cache, repo, wanted, commit)
    return Snapshot(cache, record, snap_dir, reused=False, downloaded_bytes=downloaded)


def _covers(snap: Snapshot, include: Sequence[str], exclude: Sequence[str], allow_pickle: bool) -> bool:
    """Whether a cached snapshot already holds what this pull selects (no new files needed)."""
    have = {f.path for f in snap.record.source.files}
    for path in snap.record.skipped:
        if filtered_out(path, include, exclude):
            continue
        if path.lower().endswith(PICKLE_SUFFIXES) and not allow_pickle:
            continue
        if path not in have:
            return False
    return True


def _present_files(snap: Path, files: Sequence[RemoteFile]) -> list[str]:
    out = []
    for f in files:
        try:
            if unsafe_reason(f.path) is None and (snap / f.path).stat().st_size == f.size:
                out.append(f.path)
        except OSError:
            pass
    return out


def _blob_bytes(folder: Path) -> int:
    total = 0
    blobs = folder / "blobs"
    if blobs.is_dir():
        for p in blobs.iterdir():
            if not p.name.endswith(".incomplete"):
                total += p.stat().st_size
    return total


def _fetch_all(plan: PullPlan, cache: Path, endpoint: str | None, snap_dir: Path,
               progress: Progress) -> tuple[SourceFile, ...]:
    """Download (huggingface_hub) and verify every selected file, several at a time."""
    from concurrent.futures import ThreadPoolExecutor

    progress.start("verifying", sum(f.size for f in plan.selected))
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(8, len(plan.selected)))) as pool:
            futures = [pool.submit(_fetch_one, plan, f, cache, endpoint, snap_dir, progress) for f in plan.selected]
            outcomes: list[SourceFile | MregError] = []
            for fut in futures:
                try:
                    outcomes.append(fut.result())
                except MregError as e:
                    outcomes.append(e)
    finally:
        progress.done()
    errors = [o for o in outcomes if isinstance(o, MregError)]
    if errors:
        # Integrity failures first: they say the most about what went wrong.
        raise next((e for e in errors if isinstance(e, IntegrityError)), errors[0])
    return tuple(o for o in outcomes if isinstance(o, SourceFile))


def _fetch_one(plan: PullPlan, f: RemoteFile, cache: Path, endpoint: str | None, snap_dir: Path,
               progress: Progress) -> SourceFile:
    import httpx2
    from huggingface_hub import hf_hub_download

    try:
        hf_hub_download(plan.repo, f.path, revision=plan.commit, cache_dir=cache, endpoint=endpoint)
    except (httpx2.HTTPError, OSError) as e:
        if isinstance(e, OSError):
            atomic.raise_if_full(e, cache)
        raise HubUnavailable(
            f"download of {f.path} from {plan.repo}@{plan.commit[:12]} failed: {str(e).splitlines()[0]}",
            hint="run the same pull again: files already downloaded are kept",
        ) from e
    return _verify_one(plan, f, snap_dir, progress)


def _verify_one(plan: PullPlan, f: RemoteFile, snap_dir: Path, progress: Progress) -> SourceFile:
    """Hash one downloaded file; remove and report it when it does not match the hub's metadata."""
    link = snap_dir / f.path
    blob = link.resolve()
    if f.lfs_sha256 is not None:
        sha256, git_sha1 = sha256_file(blob, progress.advance), None
    else:
        sha256, git_sha1 = hashes_file(blob, progress.advance)
    size = blob.stat().st_size
    problem = None
    if size != f.size:
        problem = f"size is {size}, the hub says {f.size}"
    elif f.lfs_sha256 is not None and sha256 != f.lfs_sha256:
        problem = f"sha256 is {sha256[:12]}…, the hub says {f.lfs_sha256[:12]}…"
    elif f.lfs_sha256 is None and f.blob_id and git_sha1 != f.blob_id:
        problem = f"git blob id is {(git_sha1 or '')[:12]}…, the hub says {f.blob_id[:12]}…"
    if problem:
        blob.unlink(missing_ok=True)
        link.unlink(missing_ok=True)
        raise IntegrityError(
            f"{plan.repo}@{plan.commit[:12]}: {f.path} is corrupt ({problem}); it was removed from the cache",
            hint="run the pull again; if it fails the same way, the copy on the hub is damaged",
        )
    atomic.fsync_file(blob)
    return SourceFile(path=f.path, size=size, sha256=sha256, lfs=f.lfs_sha256 is not None,
                      git_blob_id=f.blob_id if f.lfs_sha256 is None else None)


def _write_record(cache: Path, folder: str, commit: str, record: PullRecord) -> None:
    path = layout.pull_record_path(cache, folder, commit)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(path, record.model_dump_json(indent=2).encode())


def _write_ref(cache: Path, repo: str, revision: str, commit: str) -> None:
    if is_commit(revision) or unsafe_reason(revision):
        return
    ref = cache / repo_folder(repo) / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(ref, commit.encode())


def pull_local(cache: Path, directory: Path, *, include: Sequence[str] = (), exclude: Sequence[str] = (),
               allow_pickle: bool = False, progress: Progress | None = None) -> Snapshot:
    """Import a local model directory into the cache (copied and hashed), as a pinned snapshot."""
    import hashlib

    progress = progress or NoProgress()
    directory = directory.expanduser().absolute()
    if not directory.is_dir():
        raise NotFound(f"{directory} is not a directory", hint="give the path of a model directory")
    files: list[RemoteFile] = []
    for p in sorted(directory.rglob("*")):
        rel = p.relative_to(directory).as_posix()
        if rel.split("/")[0] in (".git", ".cache") or p.is_dir():
            continue
        if p.is_symlink() and not p.resolve().is_relative_to(directory):
            raise UnsafeInput(f"{rel} is a symlink to {p.resolve()}, outside {directory}",
                              hint="copy the file into the directory or remove the link")
        if not p.is_file():
            continue
        files.append(RemoteFile(rel, p.stat().st_size, None, None))
    if not files:
        raise NotFound(f"{directory} holds no files", hint="give the path of a model directory")
    repo = f"local/{_slug(directory.name)}-{hashlib.sha256(str(directory).encode()).hexdigest()[:8]}"
    cache.mkdir(parents=True, exist_ok=True)
    plan = plan_pull(repo, "0" * 40, files, include=include, exclude=exclude, allow_pickle=allow_pickle)
    plan = check_space(plan, cache)
    stats = {f.path: _stat(directory / f.path) for f in plan.selected}
    previous = _unchanged_import(cache, repo, stats)
    if previous is not None:
        return previous
    folder = cache / repo_folder(repo)
    blobs = folder / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    progress.start(f"importing {directory.name}", plan.missing_bytes)
    hashed: list[SourceFile] = []
    for f in plan.selected:
        tmp = atomic.temp_name(blobs / "import")
        try:
            digest = write_hashed(tmp, file_chunks(directory / f.path), progress.advance)
            os.chmod(tmp, 0o444)
            os.replace(tmp, blobs / digest)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            atomic.raise_if_full(e, cache)
            raise
        size = (blobs / digest).stat().st_size
        hashed.append(SourceFile(path=f.path, size=size, sha256=digest, lfs=True))
    progress.done()
    listing = "\n".join(f"{f.sha256} {f.path}" for f in hashed).encode()
    commit = hashlib.sha1(listing, usedforsecurity=False).hexdigest()
    snap = folder / "snapshots" / commit
    if not snap.is_dir():
        stage = atomic.temp_name(snap, "snap")
        for sf in hashed:
            link = stage / sf.path
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(os.path.relpath(blobs / sf.sha256, link.parent), link)
        try:
            os.rename(stage, snap)
        except OSError:
            shutil.rmtree(stage, ignore_errors=True)
            if not snap.is_dir():
                raise
    record = PullRecord(
        source=SourceInfo(kind="local", repo=repo, requested_revision=str(directory), commit=commit,
                          files=tuple(hashed)),
        skipped=plan.skipped_pickle + plan.skipped_filter,
        pulled=provenance.now(),
        local_stat=stats,
    )
    _write_record(cache, repo_folder(repo), commit, record)
    _write_ref(cache, repo, "main", commit)
    return Snapshot(cache, record, snap)


def _stat(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def _unchanged_import(cache: Path, repo: str, stats: dict[str, tuple[int, int]]) -> Snapshot | None:
    """The last import of this directory, when every file still has the size and mtime it was hashed with.

    Like git's index: a file changed without changing its size within the same mtime tick would be
    missed, so files modified within two seconds of the last import are always read again.
    """
    commit = cached_ref(cache, repo, "main")
    hit = load_record(cache, repo, commit) if commit else None
    if hit is None or hit.record.local_stat != stats:
        return None
    racy = hit.record.pulled.at.timestamp() - 2
    if any(mtime_ns / 1e9 >= racy for _, mtime_ns in stats.values()):
        return None
    return hit


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "model"


def pull(cache: Path, source: str, *, include: Sequence[str] = (), exclude: Sequence[str] = (),
         allow_pickle: bool = False, offline: bool = False, endpoint: str | None = None,
         progress: Progress | None = None) -> Snapshot:
    """Pull `ORG/NAME[@REV]`, `./DIR` or `file:///DIR` into the cache (a local directory ignores the hub options)."""
    local = local_source(source)
    if local is not None:
        return pull_local(cache, local, include=include, exclude=exclude, allow_pickle=allow_pickle,
                          progress=progress)
    repo, _, rev = source.partition("@")
    return pull_hub(cache, repo, rev or None, endpoint=endpoint, include=include, exclude=exclude,
                    allow_pickle=allow_pickle, offline=offline, progress=progress)


def local_source(source: str) -> Path | None:
    """The directory a source names when it is a local one (`./dir`, `/abs`, `~/x`, `file://…`)."""
    if source.startswith("file://"):
        return Path(source[len("file://"):])
    if source.startswith(("/", "./", "../", "~")) or source in (".", "..") or os.path.isdir(source):
        return Path(source)
    return None
