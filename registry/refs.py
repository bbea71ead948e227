"""Parsing `NAME@REF` and `REPO@REVISION` strings."""

from __future__ import annotations

import re
from dataclasses import dataclass

from registry import layout
from registry.errors import UsageError

LATEST = "latest"
_HEX = re.compile(r"^[0-9a-f]{6,64}$")


@dataclass(frozen=True)
class Ref:
    """A reference to a version: a number, an alias, `latest`, or a manifest digest prefix."""

    name: str
    ref: str

    @property
    def number(self) -> int | None:
        """The version number when the reference is one."""
        return int(self.ref) if self.ref.isdigit() else None

    @property
    def is_digest_prefix(self) -> bool:
        """Whether the reference could be a manifest digest prefix."""
        return bool(_HEX.match(self.ref))

    def __str__(self) -> str:
        return f"{self.name}@{self.ref}"


def parse_ref(text: str, default: str = LATEST) -> Ref:
    """Parse `NAME`, `NAME@7`, `NAME@production` or `NAME@<digest prefix>`."""
    name, _, ref = text.partition("@")
    check_name(name)
    ref = ref or default
    if not (ref.isdigit() or layout.ALIAS_RE.match(ref) or _HEX.match(ref)):
        raise UsageError(f"bad reference {text!r}", hint="use NAME@<version>, NAME@<alias> or NAME@<digest prefix>")
    if ref.isdigit() and int(ref) < 1:
        raise UsageError(f"bad version number in {text!r}", hint="versions are numbered from 1")
    return Ref(name, ref)


def is_name(text: str) -> bool:
    """Whether a string can be a model name."""
    return bool(layout.NAME_RE.match(text))


def check_name(name: str) -> str:
    """A model name must be one safe path segment."""
    if not is_name(name):
        raise UsageError(
            f"bad model name {name!r}",
            hint="use letters, digits, '.', '_' and '-' (at most 128, starting with a letter or digit)",
        )
    return name


def check_alias(alias: str) -> str:
    """An alias must be a lower-case word that cannot be mistaken for a version or a reserved name."""
    if not layout.ALIAS_RE.match(alias) or alias in layout.RESERVED_ALIASES or alias == LATEST:
        raise UsageError(
            f"bad alias name {alias!r}",
            hint="use a lower-case word such as production or staging (not "
                 f"{', '.join(sorted(layout.RESERVED_ALIASES))} or {LATEST})",
        )
    return alias
