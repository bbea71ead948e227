"""What stands in a local store where mreg keeps its own entries, checked before anything is read or removed.

What mreg writes under a model (`registry.layout` draws the whole store)::

    models/<name>/
      versions/<n>/                 <n>: ASCII digits, no leading zero (`layout.parse_version`)
      versions/<n>/manifest.json    a regular file; a directory without one is a version gc removed
      <alias>                       a symlink to versions/<n>, named by `layout.ALIAS_RE`
      .<alias>.alias-<host>-<pid>-… a flip in flight (or one a killed writer left)
      checks/<n>/, signatures/<n>/  directories of records (`*.json`, regular files)
      baselines/, history.jsonl, .lock

Anything else there (`versions/01`, `versions/²`, a file for a version, a directory for an alias) is a *stray*:
someone other than mreg put it there. Readers name it (an IntegrityError, exit 4); `list` and `verify --all` go on
with the good versions beside it; gc refuses while one is there, since it may be a reference gc cannot read.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable
from pathlib import Path

from registry import atomic, layout
from registry.errors import IntegrityError


def scan_versions(root: Path, name: str) -> tuple[list[int], list[int], list[IntegrityError]]:
    """(published, taken, strays) of a model's `versions/`: an entry named by a version number is taken (publish
    never reuses it); it is published when it is a directory holding a manifest file (a link there is listed:
    reading it refuses it, naming the link); a directory without one was removed by gc. Anything else is a stray."""
    d = layout.versions_dir(root, name)
    try:
        names = sorted(os.listdir(d))
    except FileNotFoundError:
        return [], [], []
    except NotADirectoryError:
        return [], [], [atomic.not_ours(d, f"the versions directory of {name}")]
    published: list[int] = []
    taken: list[int] = []
    strays: list[IntegrityError] = []
    for entry in names:
        p = d / entry
        n = layout.parse_version(entry)
        if n is None:
            strays.append(not_a_number(p, f"a version of {name}"))
            continue
        taken.append(n)
        manifest = p / layout.MANIFEST
        if p.is_symlink():
            published.append(n)
        elif not p.is_dir():
            strays.append(atomic.not_ours(p, f"the directory of {name}@{n}"))
        elif manifest.is_symlink() or manifest.is_file():
            published.append(n)
        elif manifest.exists():  # never opened: a FIFO would block the read
            strays.append(atomic.not_ours(manifest, f"the manifest of {name}@{n}"))
    return sorted(published), sorted(taken), strays


def model_strays(root: Path, name: str, alias: Callable[[str], int | None]) -> list[IntegrityError]:
    """Entries of `models/<name>/` that mreg does not write there, and aliases `alias` cannot read (it raises)."""
    d = layout.model_dir(root, name)
    try:
        names = sorted(os.listdir(d))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out: list[IntegrityError] = []
    for entry in names:
        p = d / entry
        try:
            if entry in layout.MODEL_DIRS:
                atomic.require_no_link(root, p, f"the {entry} directory of {name}")
                if not p.is_dir():
                    out.append(atomic.not_ours(p, f"the {entry} directory of {name}"))
            elif entry in layout.MODEL_FILES:
                if p.is_symlink() or not p.is_file():
                    out.append(atomic.not_ours(p, f"the {entry} file of {name}"))
            elif is_alias_name(entry):
                alias(entry)
            elif not atomic.is_temp_name(entry, "alias"):
                out.append(atomic.not_ours(p, f"nothing (models/{name}/ holds versions, aliases and records)"))
        except IntegrityError as e:
            out.append(e)
    return out


def record_strays(root: Path, name: str, kind: str) -> list[IntegrityError]:
    """Entries of `models/<name>/<kind>/` (signatures, checks) that are not a directory named by a version."""
    d = layout.model_dir(root, name) / kind
    try:
        atomic.require_no_link(root, d, f"the {kind} directory of {name}")
        names = sorted(os.listdir(d))
    except (FileNotFoundError, NotADirectoryError):
        return []  # no records; a file there is model_strays' to name
    except IntegrityError as e:
        return [e]
    out: list[IntegrityError] = []
    for entry in names:
        p = d / entry
        if layout.parse_version(entry) is None:
            out.append(not_a_number(p, f"the {kind} of a version of {name}"))
        elif p.is_symlink() or not p.is_dir():
            out.append(atomic.not_ours(p, f"the {kind} directory of {name}@{entry}"))
    return out


class NotRegular(OSError):
    """Something other than a regular file where mreg keeps one (reading a FIFO would block)."""


def read_regular(path: Path) -> bytes:
    """The bytes of a regular file, never following a link at its name, never opening anything else (NotRegular)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as e:
        if e.errno != errno.ELOOP:
            raise
        raise NotRegular(errno.ELOOP, "a symlink, not a regular file", str(path)) from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegular(errno.EINVAL, f"{atomic.kind(path)}, not a regular file", str(path))
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def is_alias_name(entry: str) -> bool:
    """Whether an entry of models/<name>/ is named as an alias (one `promote --alias` accepts)."""
    return bool(layout.ALIAS_RE.fullmatch(entry)) and entry not in layout.RESERVED_ALIASES


def not_a_number(path: Path, belongs: str) -> IntegrityError:
    """The error for a name where mreg keeps only version numbers (`01`, `²`, `١`, `x`)."""
    return IntegrityError(
        f"{path} is not named by a version number (ASCII digits, no leading zero) where {belongs} belongs; "
        "mreg never makes one there",
        hint="move it out of the store (keep it if it is someone's), then run `mreg verify --all`",
        details={"entry": str(path)},
    )
