"""Crash-safe writes: temp name in the destination's directory, fsync, rename."""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import socket
import stat
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from registry.errors import InsufficientSpace, IntegrityError


def temp_name(dest: Path, tag: str = "tmp") -> Path:
    """A unique sibling name for `dest`, hidden and marked with our host and pid (so `sweep` knows its writer)."""
    return dest.with_name(f".{dest.name}.{tag}-{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:12]}")


_HOST = re.sub(r"[^A-Za-z0-9_]", "_", socket.gethostname())[:64]
#: A temp name's writer: host, pid, then the unique part.
_TEMP = re.compile(r"\A\..+\.(?P<tag>[a-z]+)-(?P<host>[A-Za-z0-9_]+)-(?P<pid>[0-9]+)-[0-9a-f]{12}\Z")
#: A temp left by another host is only removed once older than this: no write takes a day.
FOREIGN_TEMP_AGE_S = 24 * 3600


def sweep(directory: Path, tag: str) -> list[Path]:
    """Remove the temps (`temp_name(…, tag)`) that killed writers left in `directory`; returns them.

    A temp is stale when its writer was this host and that process is gone, or it is another
    host's and a day old. Live writers' temps are never touched.
    """
    removed = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return []
    for p in entries:
        m = _TEMP.match(p.name)
        if m is None or m["tag"] != tag or not _abandoned(p, m["host"], int(m["pid"])):
            continue
        if p.is_dir() and not p.is_symlink():
            remove_tree(p, root=directory)
        else:
            p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def _abandoned(path: Path, host: str, pid: int) -> bool:
    if host != _HOST:
        try:
            return time.time() - path.lstat().st_mtime > FOREIGN_TEMP_AGE_S
        except OSError:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


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
    """Hold an advisory lock on `path` (created if needed); yields whether it was acquired.

    Anything but a regular file there is an IntegrityError naming it: a directory cannot be opened for writing, a
    FIFO or device is not ours to open, and a symlink would make mreg create or lock a file outside the store.
    """
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as e:
        if e.errno not in (errno.EISDIR, errno.ELOOP, errno.ENXIO):
            raise
        fd = -1
    if fd < 0 or not stat.S_ISREG(os.fstat(fd).st_mode):
        if fd >= 0:
            os.close(fd)
        raise not_ours(path, "a lock file")
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


def kind(path: Path) -> str:
    """What is at `path`, in words, without following a link ("a directory", "a symlink", "nothing")."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "nothing"
    for test, words in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symlink"),
                        (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "a device file"


def not_ours(path: Path, belongs: str) -> IntegrityError:
    """The error for an entry of the store that is not what mreg keeps there (`belongs`: what should be there)."""
    return IntegrityError(
        f"{path} is {kind(path)} where {belongs} belongs; mreg never makes one there",
        hint="move it out of the store (keep it if it is someone's), then run `mreg verify --all`",
        details={"entry": str(path)},
    )


def is_temp_name(name: str, tag: str) -> bool:
    """Whether a name is one `temp_name(…, tag)` makes (a write in flight, or one a killed writer left)."""
    m = _TEMP.match(name)
    return m is not None and m["tag"] == tag


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
