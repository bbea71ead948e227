"""GGUF v3 serialization, streamed: header, key/values and tensor infos first, then tensor data in order.

```
"GGUF" u32 version=3 | u64 n_tensors | u64 n_kv
n_kv x (string key, u32 type, value)               strings: u64 length + UTF-8 bytes
n_tensors x (string name, u32 n_dims, u64 ne[n_dims], u32 ggml_type, u64 offset)
padding to 32 | tensor data, each tensor padded to 32
```
Every byte goes through one sha256 as it is written, so the registry never reads the file again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import struct
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from registry.config import MREG_GGUF_DIRECT_IO
from registry.digest import EarlyWriteback
from registry.errors import UsageError

ALIGNMENT = 32
GGML_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q5_1": 7, "Q8_0": 8, "Q2_K": 10, "Q3_K": 11,
              "Q4_K": 12, "Q5_K": 13, "Q6_K": 14, "IQ2_XXS": 16, "IQ2_XS": 17, "IQ3_XXS": 18, "IQ1_S": 19,
              "IQ4_NL": 20, "IQ3_S": 21, "IQ2_S": 22, "IQ4_XS": 23, "IQ1_M": 29, "BF16": 30}
_U8, _I8, _U16, _I16, _U32, _I32, _F32, _BOOL, _STR, _ARR, _U64, _I64, _F64 = range(13)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry: GGUF name, dims in GGUF order (ne[0] first), type and data size."""

    name: str
    dims: tuple[int, ...]
    qtype: str
    nbytes: int


def _string(s: str) -> bytes:
    raw = s.encode("utf-8")
    return struct.pack("<Q", len(raw)) + raw


def _scalar(value: Any) -> tuple[int, bytes]:
    """The GGUF type and bytes of a scalar: bool, int (u32, or i32/u64 when it must), float (f32), str."""
    if isinstance(value, bool):
        return _BOOL, struct.pack("<?", value)
    if isinstance(value, int):
        if 0 <= value < 2**32:
            return _U32, struct.pack("<I", value)
        if -(2**31) <= value < 0:
            return _I32, struct.pack("<i", value)
        return _U64, struct.pack("<Q", value)
    if isinstance(value, float):
        return _F32, struct.pack("<f", value)
    if isinstance(value, str):
        return _STR, _string(value)
    raise TypeError(f"no GGUF type for {type(value).__name__}")


def encode_kv(key: str, value: Any) -> bytes:
    """One key/value pair; lists become arrays (token types as i32, as llama.cpp's converter writes them)."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{key}: empty array")
        if key.endswith("token_type"):
            item, items = _I32, struct.pack(f"<{len(value)}i", *value)
        elif isinstance(value[0], float):
            item, items = _F32, struct.pack(f"<{len(value)}f", *value)
        elif isinstance(value[0], str):
            item, items = _STR, b"".join(_string(v) for v in value)
        else:
            item, items = _I32, struct.pack(f"<{len(value)}i", *value)
        return _string(key) + struct.pack("<IIQ", _ARR, item, len(value)) + items
    kind, raw = _scalar(value)
    return _string(key) + struct.pack("<I", kind) + raw


def _pad(n: int) -> int:
    return -n % ALIGNMENT


def header(metadata: Sequence[tuple[str, Any]], tensors: Sequence[TensorInfo]) -> bytes:
    """Everything before the first tensor's data, padding included."""
    parts = [b"GGUF", struct.pack("<IQQ", 3, len(tensors), len(metadata))]
    parts += [encode_kv(k, v) for k, v in metadata]
    offset = 0
    for t in tensors:
        parts.append(_string(t.name) + struct.pack("<I", len(t.dims)) + struct.pack(f"<{len(t.dims)}Q", *t.dims)
                     + struct.pack("<IQ", GGML_TYPES[t.qtype], offset))
        offset += t.nbytes + _pad(t.nbytes)
    head = b"".join(parts)
    return head + b"\0" * _pad(len(head))


class HashingWriter:
    """A file written once, front to back, hashed on the way by a thread of its own; fsynced on close.

    sha256 is sequential, and so is the file: done in one thread, the two took 3.1 s of a 2.2 GB
    file's 4.5 s; side by side (both release the GIL) they overlap with each other and the encoders.

    With `direct` (see `direct_io`), where the filesystem allows it, the bytes go around the page cache
    (O_DIRECT): gathered into two page-aligned `STAGE`-byte buffers, each handed whole to a writing
    thread while the other fills, the last partial block written normally. Otherwise it writes through
    the page cache, and the kernel is asked to write out what is there as it goes
    (`registry.digest.EarlyWriteback`), so the disk works while the file is encoded.
    """

    #: Chunks handed to the hashing thread and not yet hashed (each is a few MB, kept alive until then).
    AHEAD = 8
    #: Bytes per direct write: a multiple of every block size direct I/O asks to be aligned to.
    STAGE = 8 << 20
    #: What offsets and lengths of direct writes are multiples of.
    BLOCK = 4096

    def __init__(self, path: Path, *, direct: bool = False) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        self._h = hashlib.sha256()
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sha256")  # one thread: in order
        self._pending: deque[Future[None]] = deque()
        self.size = 0
        self.direct = direct and _set_direct(self._fd, True)
        # Direct: the thread that writes each full buffer. Otherwise: early writebacks of the page cache.
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="direct-write") if self.direct else None
        self._written: Future[None] | None = None
        self._writeback = None if self.direct else EarlyWriteback(self._fd)
        self._stages = [_aligned(self.STAGE, self.BLOCK) for _ in range(2)] if self.direct else []
        self._fill = 0

    def write(self, data: bytes | memoryview) -> None:
        """Append bytes (which must not change until hashed: callers hand over fresh buffers)."""
        self._pending.append(self._hasher.submit(self._h.update, data))
        self.size += len(data)
        if self._writeback is None:
            self._stage(memoryview(data).cast("B"))
        else:
            _write_all(self._fd, memoryview(data).cast("B"))
            self._writeback.wrote(len(data))
        while len(self._pending) > self.AHEAD:
            self._pending.popleft().result()

    def _stage(self, data: memoryview) -> None:
        """Copy into the filling buffer; hand each full one to the writing thread (after the one before it)."""
        assert self._writer is not None
        while data:
            n = min(len(data), self.STAGE - self._fill)
            self._stages[0][self._fill:self._fill + n] = data[:n]
            self._fill, data = self._fill + n, data[n:]
            if self._fill == self.STAGE:
                if self._written is not None:
                    self._written.result()  # the other buffer is written (its error surfaces here)
                self._written = self._writer.submit(_write_all, self._fd, self._stages[0])
                self._stages.reverse()
                self._fill = 0

    def pad(self) -> None:
        """Zero bytes up to the next alignment boundary."""
        self.write(b"\0" * _pad(self.size))

    def close(self, *, durable: bool = True) -> str:
        """Flush, fsync (unless `durable` is False: the caller fsyncs before the file is used), close; the sha256
        of everything written."""
        while self._pending:
            self._pending.popleft().result()
        self._hasher.shutdown()
        if self._written is not None:
            self._written.result()
        if self._writeback is not None:
            self._writeback.finish()
        self._stop_io()
        if self.direct and self._fill:
            whole = self._fill // self.BLOCK * self.BLOCK
            tail = self._stages[0][:self._fill]
            _write_all(self._fd, tail[:whole])
            _set_direct(self._fd, False)  # the last partial block cannot go around the page cache
            _write_all(self._fd, tail[whole:])
        if durable:
            os.fsync(self._fd)
        self._release()
        return self._h.hexdigest()

    def _stop_io(self) -> None:
        """End the I/O thread (after the write or writeback under way; a writeback's error is raised by `finish`)."""
        if self._writer is not None:
            self._writer.shutdown()
        if self._writeback is not None:
            self._writeback.close()

    def _release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._stages = []

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self._hasher.shutdown(cancel_futures=True)
        self._stop_io()  # waits for a write under way: the descriptor and buffers are released below
        self._release()
        if t is not None:
            self.path.unlink(missing_ok=True)


#: Files from this size on are written around the page cache whatever the memory (see `direct_io`).
DIRECT_MIN_BYTES = 1 << 30


DIRECT_IO_ENV = MREG_GGUF_DIRECT_IO.name


def direct_io_setting() -> bool | None:
    """MREG_GGUF_DIRECT_IO: 1 (always around the page cache), 0 (never), unset (decided by size); anything else
    is a usage error, so that a typo does not silently fall back to the size rule."""
    value = MREG_GGUF_DIRECT_IO.value()
    if not value:
        return None
    if value not in ("0", "1"):
        raise UsageError(f"{DIRECT_IO_ENV}={value[:40]!r} is not 0 or 1",
                         hint=f"set {DIRECT_IO_ENV}=1 (write around the page cache) or 0 (never), or unset it "
                              "(decided by the file's size)")
    return value == "1"


def direct_io(file_bytes: int, source_bytes: int) -> bool:
    """Whether a GGUF file is written around the page cache: from 1 GiB on, and whenever it and its source
    together pass half the machine's memory (MREG_GGUF_DIRECT_IO=1 or 0 decides instead).

    Measured here (24 GB, first runs, `benchmarks/bench_firstrun.py`): at 7 B (13.5 GB in, 13.5 GB out) the
    output pushed its own source out of memory, and direct writes took F16 from 70.4 to 50.5 s (write 50.0 ->
    20.1 s; this disk takes direct writes at 1.2 GB/s, `dd oflag=direct`) and Q8_0 from 70.8 to 60.7 s. At
    1.1 B, where both fit, a buffered F16 (2.2 GB) spent 5.0-5.2 s of system time against 1.7-1.8 direct,
    most of it copying into freshly allocated page-cache pages (`perf`: copy_folio_from_iter_atomic, a quarter
    of all samples), which this VM hands out slowly; with the file read back in a thread beside its verification
    (`page_in`), direct won three alternating pairs (conversion 6.0-6.6 s against 7.5-8.0; first runs 0.39-0.44x
    the converter against 0.51-0.68x), and Q8_0 (1.2 GB) tied (4.7-5.7 s against 5.1-5.6). That win is the
    direct write and `release` together: the read-back lands on the pages the source just gave up; without the
    release the F16 verification took 3.7-3.9 s against 1.7-2.1 (three alternating pairs). The price: a later
    read of the source (gguf:auto's next candidate) comes from disk.
    """
    forced = direct_io_setting()
    if forced is not None:
        return forced
    if file_bytes >= DIRECT_MIN_BYTES:
        return True
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return False
    return file_bytes + source_bytes > memory // 2


def page_in(path: Path) -> None:
    """Read a file written around the page cache back into it, in a daemon thread, while its verification starts.

    llama.cpp reads the file through a map, page fault by page fault: a cold 2.2 GB file took its
    verification 6.1 s here against 2.7 s warm, and one sequential read (1.3 s, which the verification's
    start overlaps) brings it in. A file removed meanwhile (a gguf:auto candidate) just ends the read.
    """

    def read() -> None:
        buf = bytearray(HashingWriter.STAGE)
        with contextlib.suppress(OSError), open(path, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass

    threading.Thread(target=read, name="page-in", daemon=True).start()


def release(paths: Iterable[Path]) -> None:
    """Drop files already read (a written file's source) from the page cache, before a file written around it
    is read back.

    Read twice (by the writer and the reference pass), the source's pages sit on the kernel's active list and
    a file read once lands on its inactive list: where the two do not fit in memory together, reclaim takes
    the file just read back, and llama.cpp reads it from disk again page fault by page fault. At 7 B (13.5 GB
    in, 13.5 GB out, 23 GB of memory), F16's verification loaded the file in 10.9 s and evaluated it in 8.0 s
    with the source cached; a source only loses its cached copy (a later read goes to disk).
    """
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    for path in paths:
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)
            try:
                advise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _set_direct(fd: int, on: bool) -> bool:
    """Turn direct I/O on or off for a descriptor; whether it is on (False where the OS or filesystem has none)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | flag if on else flags & ~flag)
    except OSError:
        return False
    return on


def _aligned(size: int, block: int) -> memoryview:
    """A writable buffer of `size` bytes whose address is a multiple of `block` (as direct I/O wants)."""
    raw = np.empty(size + block, dtype=np.uint8)
    at = -raw.ctypes.data % block
    return raw[at:at + size].data


def _write_all(fd: int, data: memoryview) -> None:
    """Write every byte (a write may take fewer)."""
    while data:
        data = data[os.write(fd, data):]
