"""The remote bounds of `registry.incoming`, as pure functions (the hostile servers are in tests/hostile)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from registry.errors import IntegrityError, StoreUnreachable
from registry.incoming import StallFloor, page_cap, sized, unstalled


def test_sized_stops_at_the_first_chunk_past_the_size() -> None:
    read: list[int] = []

    def endless() -> Iterator[bytes]:
        while True:
            read.append(1)
            yield b"x" * 10

    got = []
    with pytest.raises(IntegrityError, match="longer than the 25 bytes declared"):
        for chunk in sized(endless(), 25, "blob", "retry"):
            got.append(chunk)
    assert sum(map(len, got)) == 20 and len(read) == 3  # the third chunk is refused, nothing after it read
    assert b"".join(sized(iter([b"ab", b"c"]), 3, "blob", "retry")) == b"abc"
    with pytest.raises(IntegrityError, match="blob is short: got 3 of 5 bytes"):
        b"".join(sized(iter([b"abc"]), 5, "blob", "retry"))


def test_unstalled_holds_every_window_to_the_floor() -> None:
    now = [0.0]

    def arrivals(gap: float, size: int, n: int) -> Iterator[bytes]:
        for _ in range(n):
            now[0] += gap
            yield b"x" * size

    floor = StallFloor(100, 1.0)
    assert len(b"".join(unstalled(arrivals(0.25, 50, 20), "blob", floor, lambda: now[0]))) == 1000  # 200 B/s
    with pytest.raises(StoreUnreachable, match="blob stalled: 40 bytes in 1 s, under the floor of 100 bytes per 1 s"):
        b"".join(unstalled(arrivals(0.25, 10, 20), "blob", floor, lambda: now[0]))  # 40 B/s
    assert len(b"".join(unstalled(arrivals(10, 1, 5), "blob", StallFloor(0, 1.0), lambda: now[0]))) == 5  # off
    assert StallFloor(1 << 20, 2).read_timeout == 2 and StallFloor(1 << 20, 600).read_timeout == 60


def test_page_cap() -> None:
    assert list(page_cap(range(3), "listing", 3)) == [0, 1, 2]
    with pytest.raises(StoreUnreachable, match="listing did not end after 3 pages"):
        list(page_cap(iter(range(10**9)), "listing", 3))
