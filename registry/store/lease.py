"""Conversion leases: who is doing a conversion, until when; taken create-only, renewed, released.

A lease is one small JSON object in a *slot* (a file of a local store, an object of an S3 store).
Every write is conditional: `create` only where the slot is empty (O_CREAT|O_EXCL under the guard
lock; S3 `If-None-Match: *`), `replace` only where the slot still holds the bytes last read
(their sha256 under the guard lock; S3 `If-Match` on the ETag). So of two waiters that both see an
expired lease, one replaces it and the other's write is refused. The lease never commits anything:
the version's manifest does; a lease only says who does the work.

    {"schema_version": 1, "name": …, "key": …, "host": …, "pid": …, "pidns": …, "id": <random>,
     "taken": <unix time>, "expires": <unix time>, "seconds": <its duration>}
"""

from __future__ import annotations

import hashlib
import os
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, ValidationError

from registry import atomic, layout
from registry.config import MREG_LEASE_SECONDS, SECONDS, env_number
from registry.errors import Conflict, MregError, UsageError


def lease_seconds() -> float:
    """The lease duration: $MREG_LEASE_SECONDS, else 60; renewed every third of it."""
    what = "a number of seconds between 0.5 and 86400"
    value = float(env_number(MREG_LEASE_SECONDS, SECONDS, what))
    if not 0.5 <= value <= 86400:
        raise UsageError(f"MREG_LEASE_SECONDS={value:g} is not {what}",
                         hint="unset it (60 s) or give e.g. MREG_LEASE_SECONDS=120")
    return value


def _pid_namespace() -> str:
    """This process's PID namespace (containers on one host share its name, not their PIDs)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


class LeaseDoc(BaseModel):
    """What a lease object holds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1
    name: str
    key: str
    host: str
    pid: int
    pidns: str
    id: str
    taken: float
    expires: float
    #: The holder's lease duration: a waiter set shorter still waits this long (runners that disagree are safe).
    seconds: float

    def holder(self) -> str:
        """The owner, as messages name it."""
        return f"{self.host} pid {self.pid} (lease {self.id[:8]})"

    def since(self) -> str:
        """When it was taken, in UTC."""
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.taken))

    def dead_here(self) -> bool:
        """Whether its owner ran on this host, in this PID namespace, and is gone (SIGKILL, OOM)."""
        if self.host != socket.gethostname() or self.pidns != _pid_namespace():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False


#: gc removes a lease this long past its expiry (a waiter takes it over at once; gc only tidies what nobody waits
#: for), and one whose bytes do not parse this long after they were written.
STALE_AFTER_S = 60.0
UNREADABLE_AFTER_S = 3600.0


def stale(data: bytes, written: float, now: float) -> bool:
    """Whether gc may remove a lease: long expired, its holder gone from this host, or unreadable and old."""
    doc = parse(data)
    if doc is None:
        return now - written > UNREADABLE_AFTER_S
    return doc.expires < now - STALE_AFTER_S or doc.dead_here()


def parse(data: bytes) -> LeaseDoc | None:
    """The lease these bytes hold; None for bytes mreg did not write whole (a writer killed mid-write)."""
    try:
        return LeaseDoc.model_validate_json(data)
    except ValidationError:
        return None


class LeaseSlot(Protocol):
    """Where one conversion's lease lives, with conditional writes; a token names the bytes last read or written."""

    where: str

    def create(self, data: bytes) -> str | None:
        """Write the lease where there is none; its token, or None when one exists."""

    def read(self) -> tuple[bytes, str] | None:
        """The lease's bytes and token, or None."""

    def replace(self, data: bytes, token: str) -> str | None:
        """Replace the lease if it still has `token`; the new token, or None when it changed."""

    def delete(self, token: str) -> None:
        """Remove the lease if it still has `token`."""


class FileSlot:
    """A lease file of a local store. Every operation holds the guard lock (fcntl) for a few ms, so that a read,
    compare and write are one step; the lease is created with O_CREAT|O_EXCL and replaced by rename."""

    def __init__(self, root: Path, name: str, key: str) -> None:
        self.path = layout.conversion_lease(root, name, key)
        self.guard = layout.conversion_lock(root, name, key)
        self.where = str(self.path)

    @classmethod
    def at(cls, path: Path) -> FileSlot:
        """The slot of a lease file found on disk (gc)."""
        slot = cls.__new__(cls)
        slot.path, slot.guard, slot.where = path, layout.lease_lock(path), str(path)
        return slot

    def _read(self) -> tuple[bytes, str] | None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        return data, hashlib.sha256(data).hexdigest()

    def create(self, data: bytes) -> str | None:
        """O_CREAT|O_EXCL, under the guard."""
        with atomic.flock(self.guard):
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return None
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            atomic.fsync_dir(self.path.parent)
            return hashlib.sha256(data).hexdigest()

    def read(self) -> tuple[bytes, str] | None:
        """Under the guard: never a half-written replacement."""
        with atomic.flock(self.guard):
            return self._read()

    def replace(self, data: bytes, token: str) -> str | None:
        """Compare the bytes' sha256 and rename the new lease over them, under the guard."""
        with atomic.flock(self.guard):
            now = self._read()
            if now is None or now[1] != token:
                return None
            atomic.write_bytes(self.path, data)
            return hashlib.sha256(data).hexdigest()

    def delete(self, token: str) -> None:
        """Unlink, if unchanged, under the guard."""
        with atomic.flock(self.guard):
            now = self._read()
            if now is not None and now[1] == token:
                self.path.unlink()

    def remove_if_stale(self, now: float) -> bool:
        """Unlink the lease (and its guard) when gc may (`stale`), judged again under the guard; whether it did."""
        with atomic.flock(self.guard):
            try:
                data, written = self.path.read_bytes(), self.path.stat().st_mtime
            except FileNotFoundError:
                return False
            if not stale(data, written, now):
                return False
            self.path.unlink()
            return True


def local_leases(root: Path) -> list[FileSlot]:
    """Every conversion lease of a local store."""
    d = layout.locks_dir(root)
    if not d.is_dir():
        return []
    atomic.require_no_link(root, d, "conversion leases")
    return [FileSlot.at(p) for p in sorted(d.glob("*" + layout.LEASE_SUFFIX)) if not p.is_symlink()]


class LeaseLost(Conflict):
    """This run's lease was taken over (it was not renewed in time): another run does the work."""

    def __init__(self, doc: LeaseDoc, where: str) -> None:
        super().__init__(f"lost the lease on {doc.name}'s conversion {doc.key[:12]}… ({where}): it was not renewed "
                         "in time and another run took it over; nothing was published by this run",
                         hint="retry: the run finds the version the other one publishes (a renewal that came too "
                              "late means a stalled machine or store, or MREG_LEASE_SECONDS set too short)")


class LeaseHeld(Conflict):
    """Another run holds the lease (with --no-wait)."""

    def __init__(self, doc: LeaseDoc, where: str) -> None:
        super().__init__(f"{doc.name}'s conversion {doc.key[:12]}… is being done by {doc.holder()} since "
                         f"{doc.since()} (lease {where})",
                         hint="wait for it (drop --no-wait): the run then returns the version it publishes",
                         details={"holder": doc.model_dump(), "lease": where})


class Lease:
    """A lease this process holds: renewed by a thread every third of its duration until released."""

    def __init__(self, slot: LeaseSlot, doc: LeaseDoc, token: str, duration: float) -> None:
        self.slot, self.doc, self.token, self.duration = slot, doc, token, duration
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.lost = False
        self._thread = threading.Thread(target=self._renew_loop, name="mreg-lease", daemon=True)
        self._thread.start()

    def renew(self) -> bool:
        """Push the expiry one duration ahead (If-Match); False once the lease is no longer ours.

        A refused replace is not yet a loss: the slot is read back, and bytes that still carry this lease's id are
        still this run's (a write that landed although its answer was lost and the retry refused, or a store that
        refused a conditional write made at the same moment as another's): the run adopts their token and tries
        again."""
        with self._lock:
            if self.lost:
                return False
            for _ in range(3):
                doc = self.doc.model_copy(update={"expires": time.time() + self.duration})
                token = self.slot.replace(doc.model_dump_json().encode(), self.token)
                if token is not None:
                    self.doc, self.token = doc, token
                    return True
                current = self._ours()
                if current is None:
                    self.lost = True
                    return False
                self.token = current
            return True  # still ours, not renewed this time: the next renewal comes before the expiry

    def _ours(self) -> str | None:
        """The slot's token when it holds this lease (by its id, whatever its expiry), else None."""
        current = self.slot.read()
        if current is None:
            return None
        doc = parse(current[0])
        return current[1] if doc is not None and doc.id == self.doc.id else None

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.duration / 3):
            try:
                if not self.renew():
                    return
            except (MregError, OSError):
                continue  # a store that did not answer this time: the next renewal may, before the expiry

    def confirm(self) -> None:
        """Renew now, or raise LeaseLost: called before publishing, so that a run taken over publishes nothing."""
        if not self.renew():
            raise LeaseLost(self.doc, self.slot.where)

    def release(self) -> None:
        """Stop renewing and remove the lease (if it is still ours)."""
        self._stop.set()
        self._thread.join()
        with self._lock:
            for attempt in range(3):  # a store that failed to answer once is asked again; gc tidies what remains
                try:
                    token = self._ours()
                    if token is not None:
                        self.slot.delete(token)
                    return
                except (MregError, OSError):
                    time.sleep(0.2 * (attempt + 1))


def new_doc(name: str, key: str, duration: float) -> LeaseDoc:
    """A lease for this process, fresh from now."""
    now = time.time()
    return LeaseDoc(name=name, key=key, host=socket.gethostname(), pid=os.getpid(), pidns=_pid_namespace(),
                    id=uuid.uuid4().hex, taken=now, expires=now + duration, seconds=duration)
