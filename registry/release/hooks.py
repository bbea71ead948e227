"""Promotion hooks: after the flip, tell the engine (command or HTTP call), wait until it is ready,
and flip the alias back when it is not, so a bad version never stays promoted.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from registry import layout
from registry.config import inherited, model_table
from registry.errors import EngineNotReady, MregError, UsageError
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


#: The longest readiness wait mreg accepts: a day covers an engine that loads a large model from cold storage;
#: anything longer is a typo (or 1e308, which the OS's timers cannot hold).
MAX_READY_TIMEOUT_S = 24 * 3600.0
#: Hook URLs: only what urllib speaks to an engine (file:// or ftp:// answer no readiness), of a sane length.
URL_SCHEMES = ("http", "https")
MAX_URL = 2048

_COMMANDS = ("reload_cmd", "ready_cmd")
_URLS = ("reload_url", "ready_url")


def check_settings(values: dict[str, Any], where: Callable[[str], str]) -> dict[str, Any]:
    """The hook settings in `values` (Hooks field names) checked and normalized, before anything is flipped;
    `where(field)` names the setting in an error (`--ready-url`, `[models.m] ready_url`)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        if key in _COMMANDS:
            out[key] = _command(value, where(key))
        elif key in _URLS:
            out[key] = _url(value, where(key))
        elif key == "ready_timeout_s":
            out[key] = _seconds(value, where(key))
        else:
            raise UsageError(f"unknown hook setting {key}", hint=f"known: {', '.join((*_COMMANDS, *_URLS))}, "
                                                                  "ready_timeout_s")
    return out


def _command(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise UsageError(f"{where} must be a shell command (a non-empty string without NUL)",
                         hint=_example(where, "'systemctl reload my-engine'"))
    return value


def _url(value: Any, where: str) -> str:
    hint = "give an http:// or https:// URL of the engine, e.g. http://127.0.0.1:8080/health"
    if not isinstance(value, str):
        raise UsageError(f"{where} must be a URL string", hint=hint)
    shown = value if len(value) <= 80 else value[:77] + "..."
    if len(value) > MAX_URL or any(c.isspace() or not c.isprintable() for c in value):
        raise UsageError(f"{where} {shown!r} is not a URL (longer than {MAX_URL} characters, or it holds spaces "
                         "or control characters)", hint=hint)
    try:
        parts = urllib.parse.urlsplit(value)
        port = parts.port  # raises for a port that is not a number in 0..65535
        urllib.request.Request(value)  # what urlopen will parse
    except ValueError as e:
        raise UsageError(f"{where} {shown!r} is not a valid URL: {e}", hint=hint) from e
    if parts.scheme.lower() not in URL_SCHEMES:
        raise UsageError(f"{where} {shown!r} has scheme {parts.scheme or '(none)'!r}; hooks call engines over "
                         f"{' or '.join(URL_SCHEMES)} only", hint=hint)
    if not parts.hostname or port == 0:
        raise UsageError(f"{where} {shown!r} names no host (or port 0)", hint=hint)
    return value


def _seconds(value: Any, where: str) -> float:
    # compared as given: float() of a huge integer overflows, and NaN fails every comparison
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_READY_TIMEOUT_S:
        shown = "a huge integer" if isinstance(value, int) and value.bit_length() > 64 else repr(value)[:40]
        raise UsageError(f"{where} must be a number of seconds above 0 and at most {MAX_READY_TIMEOUT_S:g} "
                         f"(a day), not {shown}", hint=_example(where, "30"))
    return float(value)


def _example(where: str, value: str) -> str:
    """A hint in the form the setting was given in: a flag or a config file key."""
    return f"e.g. {where} {value}" if where.startswith("--") else f"e.g. {where.split()[-1]} = {value}"


#: config file key -> Hooks field
_CONFIG_KEYS = {"reload": "reload_cmd", "reload_url": "reload_url", "ready_url": "ready_url",
                "ready_cmd": "ready_cmd", "ready_timeout": "ready_timeout_s"}


def model_policy(raw: dict[str, Any], name: str) -> tuple[Hooks, tuple[str, ...]]:
    """What the config file's `[models.NAME]` table asks of promotions: hooks (reload, reload_url, ready_url,
    ready_cmd, ready_timeout) and requirements (`require = ["hf", "check:smoke"]`)."""
    table = model_table(raw, name)
    known = {*_CONFIG_KEYS, "require", "trust", "rollout"}  # rollout: registry.release.rollout reads it
    unknown = set(table) - known
    if unknown:
        raise UsageError(f"unknown keys in [models.{name}]: {', '.join(sorted(unknown))}",
                         hint=f"known keys: {', '.join(sorted(known))}")
    require = table.get("require", [])
    if not isinstance(require, list) or not all(isinstance(r, str) for r in require):
        raise UsageError(f"[models.{name}] require must be a list of strings", hint='e.g. require = ["check:smoke"]')
    field_key = {f: k for k, f in _CONFIG_KEYS.items()}
    settings = check_settings({f: table.get(k) for k, f in _CONFIG_KEYS.items()},
                              lambda f: f"[models.{name}] {field_key[f]}")
    return Hooks(**settings), tuple(require)


#: Hooks field -> the promote flag that sets it
FLAGS = {"reload_cmd": "--reload", "reload_url": "--reload-url", "ready_url": "--ready-url",
         "ready_cmd": "--ready-cmd", "ready_timeout_s": "--ready-timeout"}


def merge(base: Hooks, **flags: Any) -> Hooks:
    """Command-line flags override the config file's hooks (each checked, and named by its flag in an error)."""
    return replace(base, **check_settings(flags, lambda f: FLAGS.get(f, f)))


def check(hooks: Hooks) -> None:
    """Refuse hook settings that could only fail after the flip (a library caller's Hooks, never parsed)."""
    check_settings({f: getattr(hooks, f) for f in FLAGS}, lambda f: FLAGS[f])
    if not (isinstance(hooks.interval_s, (int, float)) and 0 < hooks.interval_s <= MAX_READY_TIMEOUT_S):
        raise UsageError(f"hook poll interval {hooks.interval_s!r} is not a number of seconds above 0",
                         hint="leave interval_s at its default")


@dataclass(frozen=True)
class HookReport:
    """What the hooks did after one flip."""

    reload_ok: bool
    ready: bool
    seconds: float
    detail: str = ""
    steps: tuple[str, ...] = field(default=())


def run_hooks(hooks: Hooks, env: dict[str, str]) -> HookReport:
    """Reload the engine, then poll readiness until the timeout; never raises: any failure of a hook, or of mreg
    running it, is a report that is not ready (after a flip, every failure must end in the flip-back)."""
    t0 = time.monotonic()
    steps: list[str] = []
    try:
        return _run(hooks, env, t0, steps)
    except Exception as e:  # noqa: BLE001 - see above: an unforeseen error must not leave the flip standing
        detail = f"hook failed: {type(e).__name__}: {e}"
        steps.append(detail)
        return HookReport(False, False, time.monotonic() - t0, detail, tuple(steps))


def _run(hooks: Hooks, env: dict[str, str], t0: float, steps: list[str]) -> HookReport:
    if hooks.reload_cmd:
        code, tail = _sh(hooks.reload_cmd, env, hooks.ready_timeout_s)
        what = (f"reload command did not finish within {hooks.ready_timeout_s:g}s" if code is None
                else f"reload command exited {code}")
        steps.append(what)
        if code != 0:
            return HookReport(False, False, time.monotonic() - t0, f"{what}: {tail}" if code else what, tuple(steps))
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
            code, _tail = _sh(hooks.ready_cmd, env, max(1.0, deadline - time.monotonic()))
            ok = code == 0
            last = "ready command did not finish in time" if code is None else f"ready command exited {code}"
        if ok:
            steps.append(f"ready after {time.monotonic() - t0:.1f}s")
            return HookReport(True, True, time.monotonic() - t0, "", tuple(steps))
        if time.monotonic() >= deadline:
            steps.append(f"not ready after {hooks.ready_timeout_s:g}s ({last})")
            return HookReport(True, False, time.monotonic() - t0,
                              f"not ready within {hooks.ready_timeout_s:g}s (last: {last})", tuple(steps))
        time.sleep(hooks.interval_s)


def _sh(command: str, env: dict[str, str], timeout: float, stdin: bytes | None = None) -> tuple[int | None, str]:
    """Run a hook command: its exit code (None when it ran past `timeout`) and its last line of output.

    Output goes to a file, not a pipe: an engine the command starts in the background keeps a pipe open (mreg
    would wait for its end), and a chatty command cannot fill memory. The command runs in its own process group,
    killed whole when it runs past the timeout or mreg is interrupted. `stdin` is given through a file too.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as given:
        if stdin:
            given.write(stdin)
            given.seek(0)
        proc = subprocess.Popen(["/bin/sh", "-c", command], env=inherited(**env),
                                stdin=given if stdin else subprocess.DEVNULL,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except BaseException as e:  # the timeout, or Ctrl-C / SIGTERM: nothing of the hook keeps running
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if isinstance(e, subprocess.TimeoutExpired):
                return None, ""
            raise
        out.seek(max(0, out.seek(0, os.SEEK_END) - 4096))
        tail = out.read().decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    return code, tail[0][:200]


def run_command(command: str, env: dict[str, str], timeout: float, stdin: bytes | None = None
                ) -> tuple[int | None, str]:
    """Run a hook command (sh -c) in its own process group: its exit code (None past `timeout`) and last line."""
    return _sh(command, env, timeout, stdin)


def probe(url: str, method: str, timeout: float) -> tuple[bool, str]:
    """Call a URL once: whether it answered 2xx, and what it answered."""
    return _http(url, method, timeout)


def _http(url: str, method: str, timeout: float) -> tuple[bool, str]:
    req = urllib.request.Request(url, method=method, data=b"" if method == "POST" else None)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status = getattr(r, "status", None)  # None for what a redirect may reach beyond http(s)
            return isinstance(status, int) and 200 <= status < 300, f"HTTP {status}"
    except urllib.error.HTTPError as e:
        return False, f"HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        return False, f"{type(e).__name__}: {getattr(e, 'reason', e)}"
    except (http.client.HTTPException, ValueError) as e:  # a malformed answer, a redirect to a bad URL
        return False, f"{type(e).__name__}: {e}"


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """While the hooks run, SIGTERM (a cancelled CI job, `kill`) interrupts as Ctrl-C does, so that the flip-back
    still happens; Python's default would end the process with the flip standing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


@dataclass(frozen=True)
class HookedPromotion:
    """A promotion and what its hooks found."""

    change: aliases.AliasChange
    report: HookReport | None
    reverted: aliases.AliasChange | None = None
    restore: HookReport | None = None


def promote_with_hooks(store: Store, name: str, version: Version, hooks: Hooks, *, alias: str = "production",
                       **kwargs: Any) -> HookedPromotion:
    """Promote, run the hooks, and on failure flip back (recorded) and raise EngineNotReady.

    The hook settings are checked before the flip; after it, any failure (a hook's, or an error or interrupt
    while mreg runs them) ends in the flip-back, so a version the engine did not take never stays promoted.
    """
    check(hooks)
    change = aliases.promote(store, name, version, alias=alias, **kwargs)
    if not change.changed or not hooks.any:
        return HookedPromotion(change, None)
    env = {"MREG_NAME": name, "MREG_ALIAS": alias, "MREG_VERSION": str(change.to_version),
           "MREG_FROM_VERSION": str(change.from_version or ""), "MREG_STORE": store.location}
    interrupted = False
    try:
        # The path an engine mounts; an S3 alias is synced, not mounted: its record's URL names it.
        env["MREG_PATH"] = store.alias_mount(name, alias) or layout.s3_url(store.location,
                                                                           layout.s3_alias(name, alias))
        with _terminate_as_interrupt():
            report = run_hooks(hooks, env)
    except Exception as e:  # noqa: BLE001 - run_hooks reports its own; this is the mount path's lookup
        report = HookReport(False, False, 0.0, f"hook failed: {type(e).__name__}: {e}")
    except KeyboardInterrupt:  # Ctrl-C while waiting: the engine's state is unknown, so flip back
        interrupted = True
        report = HookReport(False, False, 0.0, "interrupted")
    if report.ready:
        return HookedPromotion(change, report)
    if change.from_version is None:
        raise EngineNotReady(
            f"{name}@{change.to_version} was promoted to {alias} but the engine is not ready: {report.detail}; "
            "there was no earlier version to flip back to",
            hint=f"fix the engine or run `mreg rollback {name} --to VERSION`",
        )
    try:
        reverted = aliases.rollback(store, name, alias=alias, to=change.from_version, expect=change.to_version,
                                    reason=f"automatic flip-back: {name}@{change.to_version} {report.detail}")
    except MregError as e:  # e.g. another writer moved the alias meanwhile: say that nothing was flipped back
        e.args = (f"{name}@{change.to_version} failed after promotion ({report.detail}) and the flip-back to "
                  f"{change.from_version} was not made: {e}",)
        raise
    if interrupted:  # whoever stopped mreg wants it to stop: the flip-back is quick, the hooks may not be
        err = EngineNotReady(
            f"{name}@{change.to_version} was promoted, then mreg was interrupted while the hooks ran; {alias} was "
            f"flipped back to {change.from_version} and the hooks were not run again",
            hint=f"the engine may have loaded {change.to_version}: reload it onto {change.from_version}",
        )
        err.outcome = HookedPromotion(change, report, reverted, None)
        raise err
    restore = run_hooks(hooks, {**env, "MREG_VERSION": str(change.from_version),
                                "MREG_FROM_VERSION": str(change.to_version)})
    err = EngineNotReady(
        f"{name}@{change.to_version} failed after promotion ({report.detail}); {alias} was flipped back to "
        f"{change.from_version}" + ("" if restore.ready else f", and the engine is still not ready ({restore.detail})"),
        hint=f"see `mreg history {name}`; fix the version, then promote it again",
    )
    err.outcome = HookedPromotion(change, report, reverted, restore)
    raise err
