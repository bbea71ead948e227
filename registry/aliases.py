"""Promotion and rollback: gate, lock, check `--expect`, flip, record.

Correctness rests on the rename of the alias symlink (readers see the old or the new target,
never nothing); the lock only serializes the read-modify-write of alias and history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from manifests import HistoryEntry
from registry import provenance
from registry.errors import Conflict, GateRefused, NotFound, UsageError
from registry.refs import check_alias, check_name
from registry.store import Store, Version

NONE = "none"


@dataclass(frozen=True)
class AliasChange:
    """The outcome of a promotion or rollback."""

    name: str
    alias: str
    from_version: int | None
    to_version: int
    changed: bool
    action: str


def check_gates(version: Version, requirements: Sequence[str] = ()) -> list[str]:
    """Every reason a version may not be promoted (empty when it may)."""
    problems = []
    for art in version.manifest.artifacts:
        if art.verification.status == "failed":
            problems.append(f"{art.format} artifact failed verification ({art.verification.method})")
    formats = {a.format for a in version.manifest.artifacts}
    for req in requirements:
        fmt = req.split(":", 1)[0]
        if fmt not in formats:
            problems.append(f"no {fmt} artifact (required by --require {req})")
    return problems


def parse_expect(text: str | None) -> int | str | None:
    """`--expect 6` → 6, `--expect none` → None (alias must not exist); not given → the sentinel ''."""
    if text is None:
        return ""
    if text.lower() == NONE:
        return None
    if text.isdigit() and int(text) > 0:
        return int(text)
    raise UsageError(f"bad --expect value {text!r}", hint="give a version number, or `none` for a new alias")


def promote(
    store: Store,
    name: str,
    version: Version,
    *,
    alias: str = "production",
    expect: int | str | None = "",
    reason: str | None = None,
    force: bool = False,
    require: Sequence[str] = (),
) -> AliasChange:
    """Point `alias` at `version` atomically, after the gates and the `--expect` check."""
    check_name(name)
    check_alias(alias)
    problems = check_gates(version, require)
    if problems and not force:
        raise GateRefused(
            f"{name}@{version.number} may not be promoted: {'; '.join(problems)}",
            hint="fix the version, or pass --force to promote anyway",
        )
    with store.alias_lock(name):
        current = _reconciled(store, name, alias)
        if expect != "" and current != expect:
            raise Conflict(
                f"{name} {alias} is {current if current is not None else 'unset'}, "
                f"not {expect if expect is not None else 'unset'} as expected; nothing changed",
                hint=f"run `mreg history {name}` to see who moved it, then retry with the right --expect",
            )
        if current == version.number:
            return AliasChange(name, alias, current, version.number, False, "promote")
        store.version(name, version.number)  # still published (not collected) under the lock
        store.set_alias(name, alias, version.number)
        store.append_history(name, _entry(alias, "promote", current, version.number, reason))
    return AliasChange(name, alias, current, version.number, True, "promote")


def rollback_stack(history: Sequence[HistoryEntry], alias: str) -> list[int]:
    """The versions an alias went through, newest last, with rolled-back ones removed (pure)."""
    stack: list[int] = []
    for e in history:
        if e.alias != alias:
            continue
        if e.action == "rollback" and e.to_version in stack:
            while stack and stack[-1] != e.to_version:
                stack.pop()
        elif not stack or stack[-1] != e.to_version:
            stack.append(e.to_version)
    return stack


def rollback(
    store: Store,
    name: str,
    *,
    alias: str = "production",
    to: int | None = None,
    expect: int | str | None = "",
    reason: str | None = None,
) -> AliasChange:
    """Return `alias` to the version it pointed at before (or to `to`), from the history."""
    check_name(name)
    check_alias(alias)
    with store.alias_lock(name):
        current = _reconciled(store, name, alias)
        if current is None:
            raise NotFound(f"{name} has no alias {alias}", hint=f"run `mreg promote {name}@VERSION --alias {alias}`")
        if expect != "" and current != expect:
            raise Conflict(
                f"{name} {alias} is {current}, not {expect} as expected; nothing changed",
                hint=f"run `mreg history {name}` to see who moved it",
            )
        if to is None:
            stack = rollback_stack(store.history(name), alias)
            while stack and stack[-1] == current:
                stack.pop()
            if not stack:
                raise NotFound(
                    f"{name} {alias} has no earlier version to roll back to (it is at {current})",
                    hint=f"pick one with `mreg rollback {name} --to VERSION`",
                )
            to = stack[-1]
        target = store.version(name, to)
        if target.number == current:
            return AliasChange(name, alias, current, current, False, "rollback")
        store.set_alias(name, alias, target.number)
        store.append_history(name, _entry(alias, "rollback", current, target.number, reason))
    return AliasChange(name, alias, current, target.number, True, "rollback")


def _reconciled(store: Store, name: str, alias: str) -> int | None:
    """The alias's target; if a crashed writer flipped it without recording, record that first."""
    current = store.alias(name, alias)
    if current is None:
        return None
    last = store.last_entry(name, alias)
    if last is None or last.to_version != current:
        store.append_history(
            name,
            _entry(alias, "repair", last.to_version if last else None, current,
                   "alias found pointing here without a history entry (interrupted writer); recorded"),
        )
    return current


def _entry(alias: str, action: str, frm: int | None, to: int, reason: str | None) -> HistoryEntry:
    return HistoryEntry.model_validate(
        {"alias": alias, "action": action, "from": frm, "to": to, "reason": reason, "by": provenance.now()}
    )
