"""Crash-safe writes: temp name in the destination's directory, fsync, rename."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

from registry.errors import InsufficientSpace, IntegrityError


def temp_name(dest: Path, tag: str = "tmp") -> Path:
    """A unique sibling name for `dest`, hidden and marked with our pid."""
    return dest.with_name(f".{dest.name}.{tag}-{os.getpid()}-{uuid.uuid4().hex[:12]}")


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (renames, links) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: Path) -> None:
    """Make a file's data durable (works on a read-only file)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(dest: Path, data: bytes, *, mode: int = 0o644) -> None:
    """Atomically replace `dest` with `data`."""
    tmp = temp_name(dest)
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, dest)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise_if_full(e, dest.parent)
        raise
    fsync_dir(dest.parent)


def append_line(dest: Path, line: str) -> None:
    """Append one line durably (callers serialize appenders)."""
    data = (line.rstrip("\n") + "\n").encode()
    fd = os.open(dest, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        end = os.lseek(fd, 0, os.SEEK_END)
        if end and os.pread(fd, 1, end - 1) != b"\n":
            data = b"\n" + data  # a torn line from a crashed writer stays alone on its line
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def raise_if_full(e: OSError, where: Path) -> None:
    """Turn ENOSPC / EDQUOT into InsufficientSpace with a next step."""
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        raise InsufficientSpace(
            f"no space left on the filesystem of {where}",
            hint="free space there (e.g. `mreg gc --yes`) or point the store/cache at a larger disk",
        ) from e


@contextlib.contextmanager
def flock(path: Path, *, shared: bool = False, blocking: bool = True) -> Iterator[bool]:
    """Hold an advisory lock on `path` (created if needed); yields whether it was acquired."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        flags = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
        if not blocking:
            flags |= fcntl.LOCK_NB
        try:
            fcntl.flock(fd, flags)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def first_link(root: Path, path: Path) -> Path | None:
    """The first symlink on the way from `root` down to `path` (`path` included), or None when there is none."""
    here = root
    for part in path.relative_to(root).parts:
        here = here / part
        if here.is_symlink():
            return here
    return None


def describe_link(root: Path, link: Path) -> str:
    """`link` and where it leads, relative to the store `root`: the core of every message about a stray link."""
    target = os.path.realpath(link)
    real_root = os.path.realpath(root)
    where = "inside" if os.path.commonpath([target, real_root]) == real_root else "outside"
    return f"{link} is a symlink to {target} ({where} the store)"


def require_no_link(root: Path, path: Path, what: str) -> Path:
    """`path`, once proven to be where it seems under `root` (no symlink on the way); else IntegrityError."""
    link = first_link(root, path)
    if link is None:
        return path
    raise IntegrityError(
        f"{what}: {describe_link(root, link)}; mreg never makes one there and will not follow it",
        hint=f"if nobody meant it, remove the link itself (`rm {link}`, no trailing slash: its target is left alone), "
             "then run `mreg verify --all`",
        details={"link": str(link), "target": os.path.realpath(link)},
    )


def remove_tree(path: Path, *, root: Path) -> None:
    """Remove a tree that holds read-only files and directories (blobs, published versions); absent is fine.

    `path` must lie under `root` with no symlink on the way (IntegrityError otherwise): rmtree never follows
    a link inside the tree, so that check is what keeps it from deleting anything outside `root`.
    """
    require_no_link(root, path, "refusing to delete")

    def onexc(func: object, p: str, exc: BaseException) -> None:
        # Blobs and published files are read-only; make their directories writable to remove them.
        parent = os.path.dirname(p)
        os.chmod(parent, os.stat(parent).st_mode | stat.S_IWUSR)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)

    if path.exists():
        shutil.rmtree(path, onerror=lambda f, p, e: onexc(f, p, e[1]))
