"""`--expect`: the compare in a CLI job's compare-and-swap of an alias."""

from __future__ import annotations

from registry.errors import UsageError
from registry.refs import is_number

#: `--expect none`: the alias must not exist yet.
NONE = "none"


def parse_expect(text: str | None) -> int | str | None:
    """`--expect 6` → 6, `--expect none` → None (alias must not exist); not given → the sentinel ''."""
    if text is None:
        return ""
    if text.lower() == NONE:
        return None
    if is_number(text) and int(text) > 0:
        return int(text)
    raise UsageError(f"bad --expect value {text[:80]!r}", hint="give a version number, or `none` for a new alias")
