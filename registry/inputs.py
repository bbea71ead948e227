"""Files a user names (`--golden`, `--evaluation`, `--imatrix`, `--calibration`, the config file): opened without
blocking on a FIFO, refused unless they are regular files, and read up to a bound, with one clear error for each
way they are not what was asked for. A device (`/dev/zero`) or a pipe would otherwise be read until memory runs
out, or wait forever for a writer.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from registry.errors import MregError, PermissionDenied, UsageError
from registry.units import human_size

_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def kind(mode: int) -> str:
    """What a file of this mode is, in words (`a FIFO (named pipe)`, `a character device`, `a regular file`)."""
    return next((name for test, name in _KINDS if test(mode)), "a regular file" if stat.S_ISREG(mode) else
                "not a regular file")


@contextmanager
def open_input(path: str | Path, what: str, *, limit: int, hint: str,
               missing: type[MregError] = UsageError) -> Iterator[BinaryIO]:
    """The file `path` open for reading, once it is known to be a regular file of at most `limit` bytes.

    `what` names it in errors (`--golden`, `MREG_CONFIG`); `missing` is the error a path that does not exist
    raises (NotFound where the command says exit 3). Opened with O_NONBLOCK, so that a FIFO without a writer is
    refused instead of waited on; the checks are made on the open descriptor, so a path swapped after them
    cannot bring in another file.
    """
    shown = f"{what} {path}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise missing(f"{shown}: no such file", hint=hint) from None
    except PermissionError as e:
        raise PermissionDenied(f"{shown}: permission denied ({e.strerror})", hint=hint) from None
    except OSError as e:
        raise UsageError(f"{shown}: cannot open it ({e.strerror or e})", hint=hint) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{shown} is {kind(st.st_mode)}, not a regular file", hint=hint)
        if st.st_size > limit:
            raise UsageError(f"{shown} is {human_size(st.st_size)}, more than the {human_size(limit)} mreg reads "
                             "from it", hint=hint)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        yield f


def read_input(path: str | Path, what: str, *, limit: int, hint: str,
               missing: type[MregError] = UsageError) -> bytes:
    """All the bytes of a user-named regular file of at most `limit` bytes (see `open_input`)."""
    with open_input(path, what, limit=limit, hint=hint, missing=missing) as f:
        try:
            data = f.read(limit + 1)
        except OSError as e:
            raise UsageError(f"{what} {path}: cannot read it ({e.strerror or e})", hint=hint) from None
    if len(data) > limit:  # it grew after the check
        raise UsageError(f"{what} {path} is more than the {human_size(limit)} mreg reads from it", hint=hint)
    return data


def decode_text(data: bytes, path: str | Path, what: str, *, hint: str) -> str:
    """UTF-8 text of a user-named file, or a usage error that says where it stops being text."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{what} {path} is not UTF-8 text (byte {e.start} is not)", hint=hint) from None


def check_input(path: str | Path, what: str, *, limit: int, hint: str, missing: type[MregError] = UsageError) -> None:
    """Refuse `path` unless it is a regular file of at most `limit` bytes, for a library that opens it itself."""
    with open_input(path, what, limit=limit, hint=hint, missing=missing):
        pass
