"""Pulling from a hub: huggingface_hub lists and downloads, mreg verifies every file and keeps the record."""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

from manifests import PullRecord, SourceFile, SourceInfo
from registry import atomic, layout, provenance
from registry.cache.plan import (
    PICKLE_SUFFIXES,
    PullPlan,
    RemoteFile,
    check_repo_id,
    check_space,
    filtered_out,
    is_commit,
    plan_pull,
    unsafe_reason,
)
from registry.cache.records import Snapshot, cached_ref, load_record, write_record, write_ref
from registry.digest import hashes_file, sha256_file
from registry.errors import (
    HubUnavailable,
    IntegrityError,
    MregError,
    NotFound,
)
from registry.progress import NoProgress, Progress


class Hub:
    """One repository at one revision of a hub, listed at most once: a conversion reads its config.json, then pulls
    the weights of the same commit, from the one listing."""

    def __init__(self, cache: Path, repo: str, revision: str | None = None, *, endpoint: str | None = None,
                 offline: bool = False) -> None:
        check_repo_id(repo)
        self.cache, self.repo, self.wanted, self.endpoint, self.offline = cache, repo, revision or "main", endpoint, \
            offline
        self._listed: tuple[str, list[RemoteFile]] | Snapshot | None = None

    def listing(self) -> tuple[str, list[RemoteFile]] | Snapshot:
        """The commit the revision names and its files, asked of the hub once (unreachable: the cached snapshot)."""
        if self._listed is None:
            self._listed = _listing(self.cache, self.repo, self.wanted, self.endpoint)
        return self._listed

    def at(self, commit: str) -> Hub:
        """The same repository at a commit, with this listing when it named that commit (nothing asked again)."""
        hub = Hub(self.cache, self.repo, commit, endpoint=self.endpoint, offline=self.offline)
        if isinstance(self._listed, tuple) and self._listed[0] == commit:
            hub._listed = self._listed
        return hub

    def pull(self, *, include: Sequence[str] = (), exclude: Sequence[str] = (), allow_pickle: bool = False,
             progress: Progress | None = None) -> Snapshot:
        """Download the selected files into the cache, verify every one, pin the commit."""
        cache, repo, wanted = self.cache, self.repo, self.wanted
        progress = progress or NoProgress()
        cache.mkdir(parents=True, exist_ok=True)
        if is_commit(wanted):
            hit = load_record(cache, repo, wanted)
            if hit is not None and _covers(hit, include, exclude, allow_pickle):
                return hit
        if self.offline:
            commit = wanted if is_commit(wanted) else cached_ref(cache, repo, wanted)
            hit = load_record(cache, repo, commit) if commit else None
            if hit is None:
                raise NotFound(
                    f"{repo}@{wanted} is not in the cache {cache}",
                    hint="run the same pull without --offline on a machine that reaches the hub",
                )
            return hit
        listed = self.listing()
        if isinstance(listed, Snapshot):  # the hub is unreachable, and the cache has what the ref named
            return listed
        commit, remote = listed
        hit = load_record(cache, repo, commit)
        if hit is not None and _covers(hit, include, exclude, allow_pickle):
            write_ref(cache, repo, wanted, commit)
            return hit
        folder = layout.cache_repo_dir(cache, repo)
        snap_dir = layout.cache_snapshot_dir(cache, repo, commit)
        plan = plan_pull(repo, commit, remote, include=include, exclude=exclude, allow_pickle=allow_pickle,
                         present=_present_files(snap_dir, remote))
        plan = check_space(plan, cache)
        before = _blob_bytes(folder)
        files = _fetch_all(plan, cache, self.endpoint, snap_dir, progress)
        downloaded = max(_blob_bytes(folder) - before, 0)
        record = PullRecord(
            source=SourceInfo(kind="hub", repo=repo, requested_revision=wanted, commit=commit,
                              endpoint=self.endpoint, files=files),
            skipped=plan.skipped_pickle + plan.skipped_filter,
            pulled=provenance.now(),
        )
        write_record(cache, repo, commit, record)
        write_ref(cache, repo, wanted, commit)
        return Snapshot(cache, record, snap_dir, reused=False, downloaded_bytes=downloaded)


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
    return Hub(cache, repo, revision, endpoint=endpoint, offline=offline).pull(
        include=include, exclude=exclude, allow_pickle=allow_pickle, progress=progress)


def describe_hub(cache: Path, repo: str, revision: str | None = None, *, endpoint: str | None = None,
                 offline: bool = False) -> SourceInfo:
    """The source record a default pull would write, without downloading the weights.

    A conversion key needs every file's sha256. The hub lists the LFS files' (the weights), and a
    later pull verifies the bytes against those same values; the small files it lists only by git
    blob id, so they are pulled (verified) into the cache and hashed, where the full pull reuses them.
    """
    hub = Hub(cache, repo, revision, endpoint=endpoint, offline=offline)
    wanted = hub.wanted
    if offline:
        return _whole(hub.pull(), NotFound)
    if is_commit(wanted):
        hit = load_record(cache, repo, wanted)
        if hit is not None and _covers(hit, (), (), False):
            return hit.record.source
    listed = hub.listing()
    if isinstance(listed, Snapshot):  # unreachable hub, cached snapshot: what a pull would convert
        return _whole(listed, HubUnavailable)
    commit, remote = listed
    hit = load_record(cache, repo, commit)
    if hit is not None and _covers(hit, (), (), False):
        return hit.record.source
    plan = plan_pull(repo, commit, remote)
    small = [f for f in plan.selected if f.lfs_sha256 is None]
    hashed = {}
    if small:
        snap = hub.at(commit).pull(include=[glob.escape(f.path) for f in small])
        hashed = {f.path: f for f in snap.record.source.files}
    files = tuple(hashed[f.path] if f.lfs_sha256 is None else
                  SourceFile(path=f.path, size=f.size, sha256=f.lfs_sha256, lfs=True) for f in plan.selected)
    return SourceInfo(kind="hub", repo=repo, requested_revision=wanted, commit=commit, endpoint=endpoint,
                      files=files)


def _whole(snap: Snapshot, error: type[MregError]) -> SourceInfo:
    """A cached snapshot's source, when it holds every file a default pull selects (else its key is not known)."""
    if not _covers(snap, (), (), False):
        src = snap.record.source
        raise error(f"only part of {src.repo}@{src.commit[:12]} is in the cache (its small files) and the hub cannot "
                    "be asked for the rest of its listing", hint="plan once with the hub reachable, or pull it")
    return snap.record.source


def _listing(cache: Path, repo: str, wanted: str, endpoint: str | None) -> tuple[str, list[RemoteFile]] | Snapshot:
    """The commit a revision names and its files, as the hub lists them (or, unreachable, the cached snapshot)."""
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        GatedRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        info = HfApi(endpoint=endpoint).model_info(repo, revision=wanted, files_metadata=True)
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
    if not info.sha or not is_commit(info.sha):
        raise HubUnavailable(f"the hub did not return a commit for {repo}@{wanted}", hint="retry later")
    remote = [
        RemoteFile(
            s.rfilename,
            int(s.lfs.size if s.lfs else (s.size or 0)),
            s.lfs.sha256 if s.lfs else None,
            s.blob_id,
        )
        for s in (info.siblings or [])
    ]
    return info.sha, remote


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
    blobs = folder / layout.CACHE_BLOBS
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
