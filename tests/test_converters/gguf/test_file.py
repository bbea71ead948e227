"""The GGUF file writer: the same bytes and sha256 around the page cache (direct I/O) as through it."""

from __future__ import annotations

import ctypes
import hashlib
import mmap
import os
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from converters.gguf.file import HashingWriter, direct_io, page_in, release


@pytest.mark.parametrize("direct", [True, False])
def test_the_bytes_and_digest_are_what_was_written_whatever_the_path(
        direct: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(HashingWriter, "STAGE", 64 << 10)  # many full buffers, both of them reused
    rng = np.random.default_rng(0)
    # Sizes around the buffer's and the block's: a chunk larger than a buffer, odd ones, an empty one.
    sizes = [7, 4096, 65536, 65535, 200_000, 1, 0, 131_073, 33, 5000]
    chunks = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    path = tmp_path / "f.gguf"
    with HashingWriter(path, direct=direct) as out:
        assert out.direct == direct, "this filesystem takes direct I/O"
        for chunk in chunks:
            out.write(chunk)
            out.pad()
        digest = out.close()
    expected = b""
    for chunk in chunks:
        expected += chunk
        expected += b"\0" * (-len(expected) % 32)
    assert path.read_bytes() == expected and digest == hashlib.sha256(expected).hexdigest()
    page_in(path)  # reads it back in a thread; harmless on any file


def test_direct_io_is_chosen_from_1_gib_or_when_file_and_source_pass_half_the_memory(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    monkeypatch.delenv("MREG_GGUF_DIRECT_IO", raising=False)
    half = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    assert direct_io(1 << 30, 0), "a 1 B model's F16 (2.2 GB) and Q8_0 (1.2 GB) go around the page cache"
    assert not direct_io((1 << 30) - 1, 1 << 20) or half < 1 << 30, "a small file stays in the page cache"
    assert direct_io(1 << 20, half), "a small file of a source that fills half the memory"
    assert not direct_io(1 << 20, 1 << 20)
    monkeypatch.setenv("MREG_GGUF_DIRECT_IO", "0")
    assert not direct_io(half, half)
    monkeypatch.setenv("MREG_GGUF_DIRECT_IO", "1")
    assert direct_io(1, 1)


def _resident(path: Path) -> int:
    """Pages of a file in the page cache (mincore(2) over a private map of it)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        view = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    try:
        pages = -(-size // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        buf = ctypes.c_char.from_buffer(view)
        libc = ctypes.CDLL(None, use_errno=True)
        assert libc.mincore(ctypes.c_void_p(ctypes.addressof(buf)), ctypes.c_size_t(size), vec) == 0
        del buf
        return sum(v & 1 for v in vec)
    finally:
        view.close()


def test_a_source_already_read_is_dropped_from_the_page_cache(tmp_path: Path) -> None:
    """`release` frees the page cache for the file read back next; the source itself is untouched."""
    kind = subprocess.run(["stat", "-f", "-c", "%T", str(tmp_path)], capture_output=True, text=True).stdout.strip()
    if kind == "tmpfs":
        pytest.skip("tmpfs pages are the file itself: nothing to drop")
    path = tmp_path / "model.safetensors"
    data = np.random.default_rng(0).integers(0, 255, 8 << 20, dtype=np.uint8).tobytes()
    path.write_bytes(data)
    with open(path, "rb") as f:
        os.fsync(f.fileno())  # only clean pages can be dropped
        assert f.read() == data
    assert _resident(path) > 0
    release([path, tmp_path / "missing.safetensors"])  # a file gone meanwhile is no error
    assert _resident(path) == 0
    assert path.read_bytes() == data


def test_a_failed_write_leaves_no_file(tmp_path: Path) -> None:
    path = tmp_path / "f.gguf"
    with pytest.raises(RuntimeError), HashingWriter(path) as out:
        out.write(b"x" * 10_000)
        raise RuntimeError("encoder failed")
    assert not path.exists()


@pytest.mark.slow
def test_a_conversion_written_around_the_page_cache_verifies_and_matches(
        mreg: Any, tiny_model: Callable[..., Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same file (digest) either way, and its verification (read back through the page cache) passes."""
    src = tiny_model("llama")
    digests = {}
    for forced in ("1", "0"):
        monkeypatch.setenv("MREG_GGUF_DIRECT_IO", forced)
        store = str(tmp_path / f"store-{forced}")
        r = mreg("convert", src, "--to", "gguf:F16", "--name", "m", "--store", store, "--json")
        assert r.exit_code == 0 and r.json["verification"] == {"gguf": "passed"}, r.stderr
        manifest = mreg("show", "m@1", "--store", store, "--json").json["manifest"]
        digests[forced] = [f["sha256"] for a in manifest["artifacts"] for f in a["files"]]
    assert digests["1"] == digests["0"]
