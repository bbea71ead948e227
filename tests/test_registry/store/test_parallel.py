"""The small thread pool: results in order; one worker is the calling thread, which stops at the first error."""

from __future__ import annotations

import threading

import pytest

from registry.store.parallel import parallel


def test_one_worker_runs_in_this_thread_and_stops_at_the_first_error() -> None:
    """A sync from OCI reads one layer at a time: a corrupt layer (or Ctrl-C) ends it without reading the rest."""
    seen: list[tuple[str, threading.Thread]] = []

    def fn(item: str) -> str:
        seen.append((item, threading.current_thread()))
        if item == "b":
            raise ValueError(item)
        return item

    with pytest.raises(ValueError, match="b"):
        parallel(1, fn, ["a", "b", "c"])
    assert [item for item, _ in seen] == ["a", "b"]
    assert all(t is threading.current_thread() for _, t in seen)
    assert parallel(4, str.upper, ["a", "b", "c"]) == ["A", "B", "C"]
    assert parallel(4, str.upper, []) == []
