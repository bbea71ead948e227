"""A small thread pool for I/O-bound work over many objects (remote blobs)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def parallel(workers: int, fn: Callable[[str], T], items: list[str]) -> list[T]:
    """fn over items on up to `workers` threads, results in order. One worker is this thread: the first error (or
    Ctrl-C) stops it there, where a pool would first run every item already queued."""
    if workers <= 1 or len(items) <= 1:
        return [fn(item) for item in items]
    with ThreadPoolExecutor(max_workers=min(workers, len(items))) as pool:
        return list(pool.map(fn, items))
