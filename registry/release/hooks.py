"""Promotion hooks: after the flip, tell the engine (command or HTTP call), wait until it is ready,
and flip the alias back when it is not, so a bad version never stays promoted.
"""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from registry import layout
from registry.errors import EngineNotReady, UsageError
from registry.release import aliases
from registry.store.protocol import Store, Version


@dataclass(frozen=True)
class Hooks:
    """What to run after a flip, and how to tell that the engine is serving."""

    reload_cmd: str | None = None
    reload_url: str | None = None
    ready_url: str | None = None
    ready_cmd: str | None = None
    ready_timeout_s: float = 60.0
    interval_s: float = 0.5

    @property
    def any(self) -> bool:
        """Whether any hook is set."""
        return any((self.reload_cmd, self.reload_url, self.ready_url, self.ready_cmd))


def model_policy(raw: dict[str, Any], name: str) -> tuple[Hooks, tuple[str, ...]]:
    """What the config file's `[models.NAME]` table asks of promotions: hooks (reload, reload_url, ready_url,
    ready_cmd, ready_timeout) and requirements (`require = ["hf", "check:smoke"]`)."""
    table = raw.get("models", {}).get(name, {})
    if not isinstance(table, dict):
        raise UsageError(f"[models.{name}] in the config file is not a table", hint="see the README's config section")
    known = {"reload", "reload_url", "ready_url", "ready_cmd", "ready_timeout", "require", "trust"}
    unknown = set(table) - known
    if unknown:
        raise UsageError(f"unknown keys in [models.{name}]: {', '.join(sorted(unknown))}",
                         hint=f"known keys: {', '.join(sorted(known))}")
    require = table.get("require", [])
    if not isinstance(require, list) or not all(isinstance(r, str) for r in require):
        raise UsageError(f"[models.{name}] require must be a list of strings", hint='e.g. require = ["check:smoke"]')
    timeout = table.get("ready_timeout", 60.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise UsageError(f"[models.{name}] ready_timeout must be a number of seconds", hint="e.g. ready_timeout = 30")
    hooks = Hooks(reload_cmd=table.get("reload"), reload_url=table.get("reload_url"), ready_url=table.get("ready_url"),
                  ready_cmd=table.get("ready_cmd"), ready_timeout_s=float(timeout))
    return hooks, tuple(require)


def merge(base: Hooks, **flags: Any) -> Hooks:
    """Command-line flags override the config file's hooks."""
    return replace(base, **{k: v for k, v in flags.items() if v is not None})


@dataclass(frozen=True)
class HookReport:
    """What the hooks did after one flip."""

    reload_ok: bool
    ready: bool
    seconds: float
    detail: str = ""
    steps: tuple[str, ...] = field(default=())


def run_hooks(hooks: Hooks, env: dict[str, str]) -> HookReport:
    """Reload the engine, then poll readiness until the timeout; never raises for an engine's failure."""
    t0 = time.monotonic()
    steps: list[str] = []
    if hooks.reload_cmd:
        p = subprocess.run(["/bin/sh", "-c", hooks.reload_cmd], env={**os.environ, **env}, capture_output=True,
                           text=True, timeout=hooks.ready_timeout_s)
        steps.append(f"reload command exited {p.returncode}")
        if p.returncode != 0:
            tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or [""]
            return HookReport(False, False, time.monotonic() - t0, f"reload command exited {p.returncode}: {tail[0]}",
                              tuple(steps))
    if hooks.reload_url:
        ok, what = _http(hooks.reload_url, "POST", min(30.0, hooks.ready_timeout_s))
        steps.append(f"reload {hooks.reload_url}: {what}")
        if not ok:
            return HookReport(False, False, time.monotonic() - t0, f"reload call failed: {what}", tuple(steps))
    if not (hooks.ready_url or hooks.ready_cmd):
        return HookReport(True, True, time.monotonic() - t0, "", tuple(steps))
    deadline = t0 + hooks.ready_timeout_s
    last = ""
    while True:
        ok = True
        if hooks.ready_url:
            ok, last = _http(hooks.ready_url, "GET", 5.0)
        if ok and hooks.ready_cmd:
            p = subprocess.run(["/bin/sh", "-c", hooks.ready_cmd], env={**os.environ, **env}, capture_output=True,
                               text=True, timeout=max(1.0, deadline - time.monotonic()))
            ok, last = p.returncode == 0, f"ready command exited {p.returncode}"
        if ok:
            steps.append(f"ready after {time.monotonic() - t0:.1f}s")
            return HookReport(True, True, time.monotonic() - t0, "", tuple(steps))
        if time.monotonic() >= deadline:
            steps.append(f"not ready after {hooks.ready_timeout_s:g}s ({last})")
            return HookReport(True, False, time.monotonic() - t0,
                              f"not ready within {hooks.ready_timeout_s:g}s (last: {last})", tuple(steps))
        time.sleep(hooks.interval_s)


def _http(url: str, method: str, timeout: float) -> tuple[bool, str]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return 200 <= r.status < 300, f"HTTP {r.status}"
    except urllib.error.HTTPError as e:
        return False, f"HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        return False, f"{type(e).__name__}: {getattr(e, 'reason', e)}"


@dataclass(frozen=True)
class HookedPromotion:
    """A promotion and what its hooks found."""

    change: aliases.AliasChange
    report: HookReport | None
    reverted: aliases.AliasChange | None = None
    restore: HookReport | None = None


def promote_with_hooks(store: Store, name: str, version: Version, hooks: Hooks, *, alias: str = "production",
                       **kwargs: Any) -> HookedPromotion:
    """Promote, run the hooks, and on failure flip back (recorded) and raise EngineNotReady."""
    change = aliases.promote(store, name, version, alias=alias, **kwargs)
    if not change.changed or not hooks.any:
        return HookedPromotion(change, None)
    env = {"MREG_NAME": name, "MREG_ALIAS": alias, "MREG_VERSION": str(change.to_version),
           "MREG_FROM_VERSION": str(change.from_version or ""), "MREG_STORE": store.location,
           "MREG_PATH": store.alias_mount(name, alias) or str(layout.alias_path(Path(store.location), name, alias))}
    report = run_hooks(hooks, env)
    if report.ready:
        return HookedPromotion(change, report)
    if change.from_version is None:
        raise EngineNotReady(
            f"{name}@{change.to_version} was promoted to {alias} but the engine is not ready: {report.detail}; "
            "there was no earlier version to flip back to",
            hint=f"fix the engine or run `mreg rollback {name} --to VERSION`",
        )
    reverted = aliases.rollback(store, name, alias=alias, to=change.from_version, expect=change.to_version,
                                reason=f"automatic flip-back: {name}@{change.to_version} {report.detail}")
    restore = run_hooks(hooks, {**env, "MREG_VERSION": str(change.from_version),
                                "MREG_FROM_VERSION": str(change.to_version)})
    err = EngineNotReady(
        f"{name}@{change.to_version} failed after promotion ({report.detail}); {alias} was flipped back to "
        f"{change.from_version}" + ("" if restore.ready else f", and the engine is still not ready ({restore.detail})"),
        hint=f"see `mreg history {name}`; fix the version, then promote it again",
    )
    err.outcome = HookedPromotion(change, report, reverted, restore)
    raise err
