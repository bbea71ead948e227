"""A small thread pool for I/O-bound work over many objects (remote blobs)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def parallel(workers: int, fn: Callable[[str], T], items: list[str]) -> list[T]:
    """fn over items on up to `workers` threads, results in order."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(items)))) as pool:
        return list(pool.map(fn, items))
