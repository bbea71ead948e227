"""What an intruder does to a store, and what a refusal must look like: helpers for the trust-boundary tests."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


def files(d: Path) -> dict[str, bytes]:
    """Every file under `d` and its bytes, and every symlink and its target (links not followed)."""
    out = {}
    for dirpath, dirs, names in os.walk(d):
        for fn in names + dirs:
            p = Path(dirpath) / fn
            if p.is_symlink():
                out[p.relative_to(d).as_posix()] = b"-> " + os.readlink(p).encode()
            elif fn in names:
                out[p.relative_to(d).as_posix()] = p.read_bytes()
    return out


def link_out(root: Path, rel: str, outside: Path) -> Path:
    """Move `rel` of the store to `outside` (plus a file of its own) and leave a symlink to it in its place."""
    inside = root / rel
    if inside.is_dir():
        shutil.copytree(inside, outside, symlinks=True)
        (outside / "precious.txt").write_text("not the store's to delete")
        for dirpath, _dirs, _names in os.walk(inside):
            os.chmod(dirpath, 0o755)  # published trees are read-only
        shutil.rmtree(inside)
    else:  # a file: the same bytes, but not the store's
        outside.mkdir()
        shutil.copy(inside, outside / inside.name)
        inside.unlink()
        outside = outside / inside.name
    os.symlink(outside, inside)
    return outside


def refused(r: Any, *words: str) -> None:
    """Exit 4, one error line and its hint on stderr, an IntegrityError in the --json document on stdout."""
    assert r.exit_code == 4, r.stderr + r.stdout
    error, hint = r.stderr.splitlines()
    assert error.startswith("error: ") and hint.startswith("hint: "), r.stderr
    assert r.json["error"]["type"] == "IntegrityError" and r.json["error"]["hint"], r.stdout
    for w in words:
        assert w in error, error


def _rewrite_header(data: bytes, change: Callable[[dict[str, Any], list[str]], dict[str, Any]]) -> bytes:
    """A safetensors file with its header replaced by `change(header, tensor names)`, the body kept."""
    (n,) = struct.unpack("<Q", data[:8])
    header, body = json.loads(data[8:8 + n]), data[8 + n:]
    raw = json.dumps(change(header, sorted(k for k in header if k != "__metadata__"))).encode()
    return struct.pack("<Q", len(raw)) + raw + body


def _entry(name_index: int, **changes: Any) -> Callable[[dict[str, Any], list[str]], dict[str, Any]]:
    """Change fields of one tensor's header entry (the `name_index`-th in name order)."""
    def change(h: dict[str, Any], names: list[str]) -> dict[str, Any]:
        n = names[name_index]
        return {**h, n: {**h[n], **{k: v(h[n]) if callable(v) else v for k, v in changes.items()}}}
    return change


#: How hostile or broken checkpoints damage a safetensors file: how -> its new bytes from the old ones. Each is
#: refused by mreg's reader and by the safetensors library alike.
SAFETENSORS_DAMAGE: dict[str, Callable[[bytes], bytes]] = {
    "empty": lambda d: b"",
    "five bytes": lambda d: d[:5],
    "huge header length": lambda d: struct.pack("<Q", 1 << 62) + d[8:],
    "negative header length": lambda d: struct.pack("<q", -8) + d[8:],
    "header past the end": lambda d: struct.pack("<Q", len(d)) + d[8:],
    "header not json": lambda d: struct.pack("<Q", 4) + b"nope" + d[12:],
    "header not utf-8": lambda d: struct.pack("<Q", 4) + b"\xff\xfe\xfd\xfc" + d[12:],
    "header a json array": lambda d: struct.pack("<Q", 2) + b"[]" + d[10:],
    "header nested 100000 deep": lambda d: struct.pack("<Q", 100_000) + b"[" * 100_000 + d,
    "entry not an object": lambda d: _rewrite_header(d, lambda h, ns: {**h, ns[0]: [1, 2]}),
    "unknown dtype": lambda d: _rewrite_header(d, _entry(0, dtype="F128")),
    "negative shape": lambda d: _rewrite_header(d, _entry(0, shape=lambda e: [-1, *e["shape"][1:]])),
    "string shape": lambda d: _rewrite_header(d, _entry(0, shape=lambda e: ["a", *e["shape"][1:]])),
    "shape of 10^12 elements": lambda d: _rewrite_header(d, _entry(0, shape=[10**6, 10**6])),
    "negative offset": lambda d: _rewrite_header(d, _entry(0, data_offsets=lambda e: [-4, e["data_offsets"][1]])),
    "offsets past the end": lambda d: _rewrite_header(d, _entry(0, data_offsets=[0, len(d)])),
    "overlapping tensors": lambda d: _rewrite_header(
        d, lambda h, ns: {**h, ns[1]: {**h[ns[1]], "data_offsets": h[ns[0]]["data_offsets"],
                                       "dtype": h[ns[0]]["dtype"], "shape": h[ns[0]]["shape"]}}),
    "dtype and byte count disagree": lambda d: _rewrite_header(
        d, _entry(0, dtype=lambda e: "F16" if e["dtype"] != "F16" else "F32")),
    "a tensor missing from the header": lambda d: _rewrite_header(d, lambda h, ns: {k: v for k, v in h.items()
                                                                                 if k != ns[0]}),
    "bytes after the last tensor": lambda d: d + b"\0" * 64,
}


#: Linux capabilities that let root ignore file modes: DAC_OVERRIDE, DAC_READ_SEARCH, FOWNER.
_OVERRIDES = (1 << 1) | (1 << 2) | (1 << 3)


@contextlib.contextmanager
def file_modes_enforced() -> Iterator[None]:
    """Run the body with file modes enforced, as for any user: as root, this thread (and threads it starts) drops
    the capabilities that override them, and gets them back afterwards. A read-only store is then read-only."""
    if os.geteuid() != 0:
        yield
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    saved = (ctypes.c_uint32 * 6)()  # two of {effective, permitted, inheritable}
    if libc.capget(header, saved) != 0:
        pytest.skip("capget failed: cannot enforce file modes for root here")
    lowered = (ctypes.c_uint32 * 6)(*saved)
    lowered[0] &= ~_OVERRIDES
    if libc.capset(header, lowered) != 0:
        pytest.skip("capset failed: cannot enforce file modes for root here")
    try:
        yield
    finally:
        libc.capset(header, saved)
