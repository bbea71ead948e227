"""Planning a pull (pure): which files to fetch, whether their names are safe, whether they fit."""

from __future__ import annotations

import fnmatch
import re
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from registry.errors import InsufficientSpace, UnsafeInput
from registry.units import human_size

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")

SPACE_MARGIN = 64 << 20

_COMMIT = re.compile(r"\A[0-9a-f]{40}\Z")

_REPO = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?\Z")


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

def is_commit(revision: str | None) -> bool:
    """Whether a revision is a full commit sha."""
    return bool(revision and _COMMIT.match(revision))

#: The hub's own limit on each part of a repository id.
MAX_ID_PART = 96


def check_repo_id(repo: str) -> str:
    """Refuse repository ids that are not `org/name` or `name` as the hub allows them, before any request.

    Such an id would name a cache folder the hub never serves (or one outside the cache): unsafe input.
    """
    parts = repo.split("/")
    if not _REPO.match(repo) or ".." in repo or "--" in repo or any(
            len(p) > MAX_ID_PART or p[-1] in "-." for p in parts):
        shown = repo if len(repo) <= 80 else repo[:77] + "..."
        raise UnsafeInput(f"bad repository id {shown!r}",
                          hint=f"use ORG/NAME[@REVISION] (letters, digits, '-', '_', '.'; at most {MAX_ID_PART} "
                               "each, no '--'), or ./DIR for a local directory")
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
    paths = {f.path for f in files}
    # A file and a directory of the same name (config.json and config.json/x) cannot both be written.
    bad += [(f.path, f"{parent} is also a file") for f in files for parent in _parents(f.path) if parent in paths]
    if bad:
        listed = ", ".join(f"{p!r} ({r})" for p, r in bad[:5])
        raise UnsafeInput(
            f"{repo}@{commit[:12]} has file names that would escape the cache or collide: {listed}",
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

def _parents(path: str) -> list[str]:
    """`a/b/c` -> [`a`, `a/b`]."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]


def check_space(plan: PullPlan, where: Path) -> PullPlan:
    """Refuse, with the numbers, a pull that will not fit on the cache's filesystem."""
    free = shutil.disk_usage(where).free
    if plan.missing_bytes + SPACE_MARGIN > free:
        raise InsufficientSpace(
            f"{plan.repo}@{plan.commit[:12]} needs {human_size(plan.missing_bytes)} plus a "
            f"{human_size(SPACE_MARGIN)} safety margin, but {where} has {human_size(free)} free",
            hint="free space, choose a larger --cache-dir, or narrow the pull with --include/--exclude",
        )
    return PullPlan(**{**plan.__dict__, "free_bytes": free})
