"""Alias-change events: a CloudEvents 1.0 JSON POST to every URL the config file names, for each recorded change
(promote, rollback, an automatic flip-back, every rollout step).

    [events]
    urls = ["https://hooks.example.com/mreg"]
    secret = "…"          # optional: X-Mreg-Signature: sha256=HMAC(secret, body)
    tries = 3             # optional, 1 to 10

An event is sent after its change is committed, from a thread, with a bounded number of tries and backoff; a
delivery that fails never blocks or undoes the change. An event no try delivered is kept in the store
(`events/undelivered.jsonl`; on S3 `events/undelivered/<id>.json`) and the CLI warns, naming where.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from manifests import HistoryEntry
from registry.errors import UsageError
from registry.release import hooks

EVENT_TYPE = "dev.mreg.alias.changed"
SIGNATURE_HEADER = "X-Mreg-Signature"
MAX_TRIES = 10


@dataclass(frozen=True)
class Delivery:
    """One event's delivery to one URL."""

    url: str
    event_id: str
    delivered: bool
    tries: int
    detail: str = ""
    #: Where an event no try delivered was kept (the store's undelivered events), or why it could not be.
    kept: str = ""


@dataclass
class Notifier:
    """Sends each committed history entry as a CloudEvent to every URL; a store calls it after each commit."""

    urls: tuple[str, ...]
    location: str
    secret: str | None = None
    tries: int = 3
    backoff_s: float = 0.5
    timeout_s: float = 5.0
    #: Keeps an event that no try delivered (the store's `keep_undelivered`).
    keep: Callable[[dict[str, Any]], str] | None = None
    deliveries: list[Delivery] = field(default_factory=list)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, name: str, entry: HistoryEntry) -> None:
        """Send the event for `entry` in the background (never raises)."""
        event = cloudevent(self.location, name, entry)
        body = json.dumps(event).encode()
        for url in self.urls:
            t = threading.Thread(target=self._deliver, args=(url, event, body), daemon=True)
            t.start()
            self._threads.append(t)

    def wait(self, timeout_s: float = 30.0) -> list[Delivery]:
        """Wait (bounded) for the deliveries in flight; the ones that failed (or are still trying, as failed)."""
        deadline = time.monotonic() + timeout_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            done = {(d.url, d.event_id) for d in self.deliveries}
        pending = [t for t in self._threads if t.is_alive()]
        failed = [d for d in self.deliveries if not d.delivered]
        if pending:
            failed.append(Delivery("(in flight)", "", False, 0, f"{len(pending)} deliveries still trying after "
                                                                 f"{timeout_s:g}s ({len(done)} finished)"))
        return failed

    def _deliver(self, url: str, event: dict[str, Any], body: bytes) -> None:
        event_id = str(event["id"])
        headers = {"Content-Type": "application/cloudevents+json; charset=utf-8"}
        if self.secret:
            digest = hmac.new(self.secret.encode(), body, hashlib.sha256).hexdigest()
            headers[SIGNATURE_HEADER] = f"sha256={digest}"
        detail = ""
        for attempt in range(1, self.tries + 1):
            ok, detail = _post(url, body, headers, self.timeout_s)
            if ok:
                self._record(Delivery(url, event_id, True, attempt, detail))
                return
            if attempt < self.tries:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
        kept = ""
        if self.keep is not None:
            try:
                with self._lock:
                    kept = self.keep({"id": event_id, "url": url, "tries": self.tries, "detail": detail,
                                      "at": time.time(), "event": event})
            except Exception as e:  # noqa: BLE001 - the change stands; say that the record could not be kept
                kept = f"(not kept: {type(e).__name__}: {e})"
        self._record(Delivery(url, event_id, False, self.tries, detail, kept))

    def _record(self, d: Delivery) -> None:
        with self._lock:
            self.deliveries.append(d)


def _post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> tuple[bool, str]:
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status = getattr(r, "status", None)
            return isinstance(status, int) and 200 <= status < 300, f"HTTP {status}"
    except urllib.error.HTTPError as e:
        return False, f"HTTP {e.code}"
    except (OSError, http.client.HTTPException, ValueError) as e:
        return False, f"{type(e).__name__}: {getattr(e, 'reason', e)}"


def cloudevent(location: str, name: str, entry: HistoryEntry) -> dict[str, Any]:
    """The CloudEvents 1.0 structured-mode document of one alias change."""
    weight = entry.rollout.weight if entry.rollout is not None else None
    return {
        "specversion": "1.0", "type": EVENT_TYPE, "source": f"mreg:{location}", "id": uuid.uuid4().hex,
        "time": entry.by.at.isoformat().replace("+00:00", "Z"), "subject": f"{name}/{entry.alias}",
        "datacontenttype": "application/json",
        "data": {"model": name, "alias": entry.alias, "action": entry.action, "from": entry.from_version,
                 "to": entry.to_version, "weight": weight,
                 "canary": entry.rollout.canary if entry.rollout is not None else None,
                 "who": f"{entry.by.user}@{entry.by.host}", "why": entry.reason},
    }


def notifier(raw: dict[str, Any], location: str, keep: Callable[[dict[str, Any]], str] | None = None
             ) -> Notifier | None:
    """The config file's `[events]` table as a Notifier (None without URLs); a UsageError for a bad setting."""
    table = raw.get("events")
    if table is None:
        return None
    hint = 'e.g. [events] urls = ["https://hooks.example.com/mreg"], secret = "…", tries = 3'
    if not isinstance(table, dict):
        raise UsageError("[events] in the config file is not a table", hint=hint)
    unknown = set(table) - {"urls", "secret", "tries"}
    if unknown:
        raise UsageError(f"unknown keys in [events]: {', '.join(sorted(unknown))}", hint=hint)
    urls = table.get("urls", [])
    if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
        raise UsageError("[events] urls must be a list of URLs", hint=hint)
    checked = tuple(str(hooks.check_settings({"ready_url": u}, lambda _f: "[events] urls:")["ready_url"])
                    for u in urls)
    secret = table.get("secret")
    if secret is not None and (not isinstance(secret, str) or not secret):
        raise UsageError("[events] secret must be a non-empty string", hint=hint)
    tries = table.get("tries", 3)
    if isinstance(tries, bool) or not isinstance(tries, int) or not 1 <= tries <= MAX_TRIES:
        raise UsageError(f"[events] tries must be a whole number from 1 to {MAX_TRIES}", hint=hint)
    return Notifier(checked, location, secret, tries, keep=keep) if checked else None
