"""Quantities for people: sizes in binary units."""

from __future__ import annotations


def human_size(n: int) -> str:
    """1536 → '1.5 KiB'."""
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"
