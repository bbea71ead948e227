"""Bounds on bytes that arrive from a remote (an OCI registry, an S3 endpoint): the size that was declared, a floor
on the rate, and a cap on listing pages.

A blob's size is declared before its bytes arrive (a manifest's descriptor, a version's manifest), so
nothing past it is ever read or written: a registry that streams on is refused at the first byte over
it, and a short one is called short. The declared size bounds the space; the floor bounds the time.

The floor: every window of `MREG_STALL_SECONDS` (60 s, the per-read timeout the clients already use)
must bring `MREG_STALL_BYTES` (1 MiB, about 17 KiB/s, 140 kbit/s per connection), on every OCI blob,
manifest and referrers page and every S3 object body. A link slower than
that would take eight hours a gigabyte, so no model moves over it anyway, while a registry that sends
a byte a second (60 bytes a window) is stopped within a window instead of running for days. A stall
is a remote failure that the next try may not meet: StoreUnreachable, exit 9. `MREG_STALL_BYTES=0`
turns the floor off.

Listing pages: at most `MREG_MAX_LIST_PAGES` (10,000) pages of one listing (an S3 page holds up to 1,000
keys: ten million objects, where an mreg store holds a blob per distinct file), so an endpoint that
always answers "there is more" is refused after about 10,000 requests instead of never.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from registry.config import MREG_MAX_LIST_PAGES, MREG_STALL_BYTES, MREG_STALL_SECONDS, SECONDS, WHOLE, env_number
from registry.errors import IntegrityError, StoreUnreachable, UsageError

STALL_BYTES_ENV = MREG_STALL_BYTES.name
STALL_SECONDS_ENV = MREG_STALL_SECONDS.name
MAX_LIST_PAGES_ENV = MREG_MAX_LIST_PAGES.name
T = TypeVar("T")

@dataclass(frozen=True)
class StallFloor:
    """At least `min_bytes` must arrive in every `seconds` (never, when `min_bytes` is 0)."""

    min_bytes: int
    seconds: float

    def describe(self) -> str:
        """The floor in words ("1048576 bytes per 60 s")."""
        return f"{self.min_bytes} bytes per {self.seconds:g} s"

    @property
    def read_timeout(self) -> float:
        """How long one read may wait: a window without a byte is a stall too (60 s at most, as before)."""
        return min(60.0, self.seconds) if self.min_bytes else 60.0


def stall_floor() -> StallFloor:
    """The floor the environment sets (`MREG_STALL_BYTES`, `MREG_STALL_SECONDS`), else 1 MiB per 60 s."""
    min_bytes = int(env_number(MREG_STALL_BYTES, WHOLE, "a number of bytes (ASCII digits)"))
    seconds = float(env_number(MREG_STALL_SECONDS, SECONDS, "a number of seconds over 0"))
    if seconds <= 0:
        raise UsageError(f"{STALL_SECONDS_ENV} must be over 0", hint=f"set {STALL_SECONDS_ENV} to seconds, or unset it")
    return StallFloor(min_bytes, seconds)


def max_list_pages() -> int:
    """How many pages one listing may take (`MREG_MAX_LIST_PAGES`, else 10,000)."""
    pages = int(env_number(MREG_MAX_LIST_PAGES, WHOLE, "a number of pages (ASCII digits)"))
    if pages < 1:
        raise UsageError(f"{MAX_LIST_PAGES_ENV} must be 1 or more", hint=f"unset {MAX_LIST_PAGES_ENV}")
    return pages


def sized(chunks: Iterable[bytes], size: int, what: str, hint: str) -> Iterator[bytes]:
    """The chunks of something whose size was declared, stopped at the first chunk past it (IntegrityError:
    "{what} is longer than the N bytes declared"), and IntegrityError ("{what} is short: got N of M bytes") when
    it ends before."""
    got = 0
    for chunk in chunks:
        got += len(chunk)
        if got > size:
            raise IntegrityError(f"{what} is longer than the {size} bytes declared; stopped there", hint=hint)
        yield chunk
    if got < size:
        raise IntegrityError(f"{what} is short: got {got} of {size} bytes", hint=hint)


def unstalled(chunks: Iterable[bytes], what: str, floor: StallFloor | None = None,
              clock: Callable[[], float] = time.monotonic) -> Iterator[bytes]:
    """The chunks as they arrive, StoreUnreachable ("{what} stalled: …") when a window brings fewer bytes than the
    floor. (A window with no byte at all ends in the client's read timeout, `StallFloor.read_timeout`.)"""
    floor = floor or stall_floor()
    start, seen = clock(), 0
    for chunk in chunks:
        seen += len(chunk)
        now = clock()
        if floor.min_bytes and now - start >= floor.seconds:
            if seen < floor.min_bytes:
                raise StoreUnreachable(
                    f"{what} stalled: {seen} bytes in {now - start:.0f} s, under the floor of {floor.describe()}; "
                    "nothing was kept",
                    hint=f"retry; on a link this slow, lower {STALL_BYTES_ENV} (0 turns the floor off)")
            start, seen = now, 0
        yield chunk


def page_cap(pages: Iterable[T], what: str, cap: int | None = None) -> Iterator[T]:
    """The pages of a listing, StoreUnreachable once it runs past the cap (`max_list_pages`)."""
    cap = cap or max_list_pages()
    for n, page in enumerate(pages, 1):
        if n > cap:
            raise StoreUnreachable(f"{what} did not end after {cap} pages; refused",
                                   hint=f"check the endpoint (it keeps answering that more follows); a store this "
                                        f"large needs {MAX_LIST_PAGES_ENV} raised")
        yield page
