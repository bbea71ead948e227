"""Parsing `NAME@REF` and `REPO@REVISION` strings."""

from __future__ import annotations

import re
from dataclasses import dataclass

from registry import layout
from registry.errors import UsageError

LATEST = "latest"
_HEX = re.compile(r"\A[0-9a-f]{6,64}\Z")
#: A version number: ASCII digits only (`str.isdigit` and `int` also take '²' and '١'), and few enough that no
#: store holds more versions (18 digits stay within a 64-bit integer; `int` refuses 4,300 digits with a traceback).
_NUMBER = re.compile(r"\A[0-9]{1,18}\Z")


@dataclass(frozen=True)
class Ref:
    """A reference to a version: a number, an alias, `latest`, or a manifest digest prefix."""

    name: str
    ref: str

    @property
    def number(self) -> int | None:
        """The version number when the reference is one."""
        return int(self.ref) if is_number(self.ref) else None

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
    if not (is_number(ref) or layout.ALIAS_RE.match(ref) or _HEX.match(ref)):
        raise UsageError(f"bad reference {_shown(text)!r}",
                         hint="use NAME@<version>, NAME@<alias> or NAME@<digest prefix> (ASCII digits and letters)")
    if is_number(ref) and int(ref) < 1:
        raise UsageError(f"bad version number in {text!r}", hint="versions are numbered from 1")
    return Ref(name, ref)


def is_number(text: str) -> bool:
    """Whether a string is a version number as mreg writes one: 1 to 18 ASCII digits."""
    return bool(_NUMBER.match(text))


def version_number(text: str, what: str) -> int:
    """A version number given as `what` (`--to`, `--expect`): ASCII digits, from 1, or a usage error."""
    if not is_number(text) or int(text) < 1:
        raise UsageError(f"bad {what} value {_shown(text)!r}: not a version number",
                         hint="versions are numbered from 1 (ASCII digits); `mreg list NAME` shows them")
    return int(text)


def _shown(text: str) -> str:
    """A user's string cut to a length an error line can hold."""
    return text if len(text) <= 80 else text[:77] + "..."


def is_name(text: str) -> bool:
    """Whether a string can be a model name."""
    return bool(layout.NAME_RE.match(text))


def check_name(name: str) -> str:
    """A model name must be one safe path segment."""
    if not is_name(name):
        raise UsageError(
            f"bad model name {_shown(name)!r}",
            hint="use letters, digits, '.', '_' and '-' (at most 128, starting with a letter or digit)",
        )
    return name


def check_alias(alias: str) -> str:
    """An alias must be a lower-case word that cannot be mistaken for a version or a reserved name."""
    if not layout.ALIAS_RE.match(alias) or alias in layout.RESERVED_ALIASES or alias == LATEST:
        raise UsageError(
            f"bad alias name {_shown(alias)!r}",
            hint="use a lower-case word such as production or staging (not "
                 f"{', '.join(sorted(layout.RESERVED_ALIASES))} or {LATEST})",
        )
    return alias
