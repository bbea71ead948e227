"""Every on-disk name mreg uses, in one place.

Store::

    <store>/
      blobs/sha256/ab/ab12…              immutable, read-only, named by their sha256
      tmp/                               work and staging directories (same filesystem as blobs)
      caches/<format>/…                  what converters keep to speed up rebuilds (TensorRT timing caches)
      gc.lock                            publishers hold it shared, gc exclusive
      models/<name>/
        versions/<n>/manifest.json       written last: its presence means the version is complete
        versions/<n>/<format>/…          the artifact tree, hard links to blobs
        versions/<n>/.deleted            tombstone left by gc so that <n> is never reused
        production -> versions/7         an alias: a relative symlink
        history.jsonl                    append-only log of alias changes
        .lock                            serializes alias writers

Cache: huggingface_hub's own layout (`models--org--name/{blobs,snapshots,refs}`) plus
`.mreg/pulls/<repo folder>/<commit>.json`, the record of what mreg verified.
"""

from __future__ import annotations

import re
from pathlib import Path

BLOBS = "blobs"
BLOB_ALGO = "sha256"
TMP = "tmp"
CACHES = "caches"
GC_LOCK = "gc.lock"
MODELS = "models"
VERSIONS = "versions"
MANIFEST = "manifest.json"
TOMBSTONE = ".deleted"
HISTORY = "history.jsonl"
ALIAS_LOCK = ".lock"

CACHE_MREG = ".mreg"
CACHE_PULLS = "pulls"

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ALIAS_RE = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
RESERVED_ALIASES = frozenset({VERSIONS, "history", "tmp"})


def blob_path(root: Path, sha256: str) -> Path:
    """Path of the blob with this digest."""
    return root / BLOBS / BLOB_ALGO / sha256[:2] / sha256


def blobs_dir(root: Path) -> Path:
    """Directory holding every blob."""
    return root / BLOBS / BLOB_ALGO


def tmp_dir(root: Path) -> Path:
    """Directory for work and staging trees, on the store's filesystem."""
    return root / TMP


def caches_dir(root: Path) -> Path:
    """Directory of converters' rebuild caches: never part of a version, safe to delete."""
    return root / CACHES


def model_dir(root: Path, name: str) -> Path:
    """Directory of one model."""
    return root / MODELS / name


def versions_dir(root: Path, name: str) -> Path:
    """Directory holding the numbered versions of one model."""
    return model_dir(root, name) / VERSIONS


def version_dir(root: Path, name: str, version: int) -> Path:
    """Directory of one version."""
    return versions_dir(root, name) / str(version)


def alias_path(root: Path, name: str, alias: str) -> Path:
    """Path of an alias symlink."""
    return model_dir(root, name) / alias


def alias_target(version: int) -> str:
    """The relative target an alias symlink carries for a version."""
    return f"{VERSIONS}/{version}"


def parse_alias_target(target: str) -> int | None:
    """The version an alias symlink target names, or None when it is not one of ours."""
    m = re.fullmatch(rf"{VERSIONS}/([1-9][0-9]*)", target)
    return int(m.group(1)) if m else None


def pull_record_path(cache: Path, repo_folder: str, commit: str) -> Path:
    """Where mreg keeps its record of a verified snapshot."""
    return cache / CACHE_MREG / CACHE_PULLS / repo_folder / f"{commit}.json"
