"""Promotion and rollback: gate, lock, check `--expect`, flip, record.

Correctness rests on the rename of the alias symlink (readers see the old or the new target,
never nothing); the lock only serializes the read-modify-write of alias and history.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from manifests import HistoryEntry
from registry import provenance
from registry.errors import Conflict, GateRefused, NotFound, UsageError
from registry.refs import check_alias, check_name
from registry.release.gates import check_gates
from registry.store.protocol import HistoryLoader, Store, Version
from registry.store.trust import TrustPolicy


@dataclass(frozen=True)
class AliasChange:
    """The outcome of a promotion or rollback."""

    name: str
    alias: str
    from_version: int | None
    to_version: int
    changed: bool
    action: str


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
    trust: TrustPolicy | None = None,
) -> AliasChange:
    """Point `alias` at `version` atomically, after the gates and the `--expect` check."""
    check_name(name)
    check_alias(alias)
    problems = check_gates(version, require, store, trust)
    if problems and not force:
        raise GateRefused(
            f"{name}@{version.number} may not be promoted: {'; '.join(problems)}",
            hint="fix the version, or pass --force to promote anyway",
        )

    def decide(current: int | None, _history: HistoryLoader) -> HistoryEntry | None:
        # Under the lock (or after the read a conditional PUT is checked against): a rollout started meanwhile
        # refuses. Only here: a check before the transaction would be a second read for nothing.
        under_rollout(store, name, alias, "promote")
        _check_expect(name, alias, current, expect)
        if current == version.number:
            return None
        store.version(name, version.number)  # still published (not collected) as we flip
        return _entry(alias, "promote", current, version.number, reason)

    current, entry = store.transact_alias(name, alias, decide)
    if entry is None:
        return AliasChange(name, alias, current, version.number, False, "promote")
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


def parse_time(text: str) -> dt.datetime:
    """An ISO 8601 time (`2026-12-03T17:00`, `2026-12-03`, with an offset or `Z`); without an offset it is UTC."""
    try:
        at = dt.datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise UsageError(f"{text!r} is not a time", hint="give an ISO 8601 time, e.g. 2026-12-03T17:00:00Z") from None
    return at if at.tzinfo is not None else at.replace(tzinfo=dt.timezone.utc)


def aliases_at(history: Sequence[HistoryEntry], at: dt.datetime) -> dict[str, HistoryEntry]:
    """Which version every alias pointed to at `at`: each alias's last history entry made at or before it (pure).

    An alias with no entry by then did not exist yet. Entries are taken in the order of their time stamps (a
    log merged from several machines may hold them out of order), ties in the log's own order.
    """
    state: dict[str, HistoryEntry] = {}
    for e in sorted(history, key=lambda e: e.by.at):
        if e.by.at > at:
            break
        state[e.alias] = e
    return dict(sorted(state.items()))


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
    if to is not None and (isinstance(to, bool) or not isinstance(to, int) or to < 1):
        raise UsageError(f"bad rollback target {to!r}: not a version number", hint="versions are numbered from 1")
    under_rollout(store, name, alias, "rollback")

    def decide(current: int | None, history: HistoryLoader) -> HistoryEntry | None:
        if current is None:
            raise NotFound(f"{name} has no alias {alias}", hint=f"run `mreg promote {name}@VERSION --alias {alias}`")
        under_rollout(store, name, alias, "rollback")  # again under the lock: a rollout started meanwhile
        _check_expect(name, alias, current, expect)
        target = to
        if target is None:
            stack = rollback_stack(history(), alias)
            while stack and stack[-1] == current:
                stack.pop()
            if not stack:
                raise NotFound(
                    f"{name} {alias} has no earlier version to roll back to (it is at {current})",
                    hint=f"pick one with `mreg rollback {name} --to VERSION`",
                )
            target = stack[-1]
        store.version(name, target)
        if target == current:
            return None
        return _entry(alias, "rollback", current, target, reason)

    current, entry = store.transact_alias(name, alias, decide)
    if entry is None:
        return AliasChange(name, alias, current, current or 0, False, "rollback")
    return AliasChange(name, alias, current, entry.to_version, True, "rollback")


def under_rollout(store: Store, name: str, alias: str, what: str) -> None:
    """Refuse to move an alias under a staged rollout (exit 5): `api.promote` and `api.rollback` with `force`
    abort the rollout first (`registry.release.rollout.abort_for`)."""
    rec = store.rollout(name, alias)
    if rec is None or rec.state not in ("running", "paused"):
        return
    raise Conflict(f"{name} {alias} is under a staged rollout of {rec.canary} ({rec.state}, at {rec.weight}%); "
                   f"{what} refused, nothing changed",
                   hint=f"abort it first (`mreg rollout abort {name} --alias {alias}`), or pass --force, which "
                        "aborts it")


def _check_expect(name: str, alias: str, current: int | None, expect: int | str | None) -> None:
    if expect != "" and current != expect:
        raise Conflict(
            f"{name} {alias} is {current if current is not None else 'unset'}, "
            f"not {expect if expect is not None else 'unset'} as expected; nothing changed",
            hint=f"run `mreg history {name}` to see who moved it, then retry with the right --expect",
        )


def _entry(alias: str, action: str, frm: int | None, to: int, reason: str | None) -> HistoryEntry:
    """A history entry stamped with who, where and when."""
    return HistoryEntry.model_validate(
        {"alias": alias, "action": action, "from": frm, "to": to, "reason": reason, "by": provenance.now()}
    )
