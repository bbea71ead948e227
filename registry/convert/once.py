"""One conversion key, one run doing the work, on any number of machines sharing a store.

    find the version by its key ─ found ─────────────────────────────────▶ reused
      │ none
    create the lease (create-only) ─ taken ─▶ find again ─ none ─▶ work (lease renewed) ─▶ publish ─▶ release
      │ held by another                                  └ found (published meanwhile) ─▶ release ─▶ reused
    expired (not renewed for a whole duration, or its holder is gone from this host)?
      ├ yes: replace it (conditional on the bytes read): won ─▶ as "taken"; lost ─▶ loop
      └ no: --no-wait ─▶ LeaseHeld (exit 5); else say who holds it (once per holder), sleep, loop

Expiry is judged on this machine's own clock: a lease whose bytes did not change for one duration
(this run's, or the holder's when longer) while this run watched is expired, whatever the holder's
clock says; so is one whose written expiry lies more than a duration in the past (a lease abandoned
long before this run started).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from registry.store.lease import Lease, LeaseDoc, LeaseHeld, LeaseSlot, lease_seconds, new_doc, parse

T = TypeVar("T")
V = TypeVar("V")


@dataclass(frozen=True)
class Waiting:
    """What a waiter reports: who holds the lease, where it lives."""

    holder: LeaseDoc | None
    where: str


@dataclass(frozen=True)
class Done(Generic[T, V]):
    """A run's result: the work's (made here) or the version found."""

    made: T | None
    found: V | None


def run_once(slot: LeaseSlot, name: str, key: str, *, find: Callable[[], V | None], work: Callable[[Lease], T],
             wait: bool = True, on_wait: Callable[[Waiting], None] | None = None,
             duration: float | None = None) -> Done[T, V]:
    """Find the version of this key, or do the work under the lease, or wait for the run that does it."""
    duration = duration if duration is not None else lease_seconds()
    poll = min(2.0, max(0.05, duration / 10))
    seen: tuple[str, float] | None = None  # the lease's token and when this run first saw it
    told: str | None = None
    while True:
        found = find()
        if found is not None:
            return Done(None, found)
        doc = new_doc(name, key, duration)
        token = slot.create(doc.model_dump_json().encode())
        if token is None:
            current = slot.read()
            if current is None:
                continue  # released between the two reads
            data, held = current
            other = parse(data)
            if seen is None or seen[0] != held:
                seen = (held, time.monotonic())
            if other is not None and other.id == doc.id:
                token = held  # this run's own create landed, though its answer was lost and the retry refused
            elif _expired(other, seen[1], duration):
                token = slot.replace(doc.model_dump_json().encode(), held)
                if token is None:
                    continue  # another waiter took it over first
            else:
                if not wait:
                    raise LeaseHeld(other, slot.where) if other else LeaseHeld(_unknown(name, key), slot.where)
                if on_wait is not None and told != (other.id if other else held):
                    told = other.id if other else held
                    on_wait(Waiting(other, slot.where))
                time.sleep(poll)
                continue
        lease = Lease(slot, doc, token, duration)
        try:
            found = find()  # published (and released) between this run's first look and its lease
            if found is not None:
                return Done(None, found)
            return Done(work(lease), None)
        finally:
            lease.release()


def _expired(doc: LeaseDoc | None, first_seen: float, duration: float) -> bool:
    """Unchanged for a whole duration while watched, long past its own expiry, unreadable and old, or its holder
    gone from this host."""
    if doc is not None:
        duration = max(duration, doc.seconds)  # a holder with a longer lease than this run's is given all of it
    if time.monotonic() - first_seen > duration:
        return True
    if doc is None:
        return False  # a writer cut short, or being written: judged by watching it
    return doc.expires < time.time() - duration or doc.dead_here()


def _unknown(name: str, key: str) -> LeaseDoc:
    """A stand-in for a lease whose bytes do not parse (being written), to name in messages."""
    return LeaseDoc(name=name, key=key, host="unknown host", pid=0, pidns="", id="?", taken=0, expires=0, seconds=0)
