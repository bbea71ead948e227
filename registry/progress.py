"""Progress reporting as a seam: the library reports, the CLI decides how (or whether) to draw."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    """Receives progress of long work."""

    def start(self, desc: str, total: int | None, unit: str = "B") -> None:
        """A new task begins."""

    def advance(self, n: int) -> None:
        """`n` more units of the current task are done."""

    def done(self) -> None:
        """The current task finished."""


class NoProgress:
    """Discards progress."""

    def start(self, desc: str, total: int | None, unit: str = "B") -> None:
        """Ignore."""

    def advance(self, n: int) -> None:
        """Ignore."""

    def done(self) -> None:
        """Ignore."""
