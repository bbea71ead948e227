"""Where the cache and the store are: flag, then environment, then config file; never a silent default."""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.errors import UsageError
from registry.inputs import decode_text, kind, read_input

#: ASCII numbers as environment settings take them (float() and int() also take '١٢٠', 'nan' and '1e999').
WHOLE = re.compile(r"[0-9]{1,15}")
SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{1,6})?")


def env_number(name: str, pattern: re.Pattern[str], default: str, what: str) -> str:
    """The environment variable `name` (else `default`) when it fully matches `pattern`; a UsageError saying it
    must be `what` otherwise. The one reader of mreg's numeric settings from the environment."""
    value = os.environ.get(name, "").strip() or default
    if not pattern.fullmatch(value):
        shown = value[:40] if value.isascii() and value.isprintable() else repr(value[:40])
        raise UsageError(f"{name}={shown} is not {what}", hint=f"set {name} to {what}, or unset it")
    return value

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CACHE_ENV = "MREG_CACHE_DIR"
STORE_ENV = "MREG_STORE"
CONFIG_ENV = "MREG_CONFIG"
#: A config file names a store, a cache, hooks and trust keys: a few KiB. The bound refuses a wrong path
#: (`/dev/zero`, a checkpoint) before it is read into memory.
MAX_CONFIG = 1 << 20


@dataclass(frozen=True)
class Setting:
    """A resolved setting and where its value came from."""

    value: str | None
    origin: str


@dataclass(frozen=True)
class Settings:
    """The resolved configuration of one command."""

    config_path: Path
    config_exists: bool
    cache_dir: Setting
    store: Setting
    raw: dict[str, Any]

    def require_cache(self) -> Path:
        """The cache root, or a usage error that says how to choose one."""
        if not self.cache_dir.value:
            raise UsageError(
                "no cache directory chosen",
                hint=f"pass --cache-dir DIR, set {CACHE_ENV}, or set cache_dir in {self.config_path}",
            )
        root = Path(self.cache_dir.value).expanduser().absolute()
        if root.exists() and not root.is_dir():  # /dev/null, a file: every write under it would fail mid-pull
            raise UsageError(f"the cache {root} ({self.cache_dir.origin}) is {kind(root.stat().st_mode)}, not a "
                             "directory", hint=f"give a directory with --cache-dir or {CACHE_ENV}")
        return root

    def require_store(self) -> str:
        """The store location, or a usage error that says how to choose one."""
        if not self.store.value:
            raise UsageError(
                "no store chosen",
                hint=f"pass --store DIR, set {STORE_ENV}, or set store in {self.config_path}",
            )
        return self.store.value


def default_config_path() -> Path:
    """The config file mreg reads when none is named."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "mreg" / "config.toml"


def load(config: str | None = None, cache_dir: str | None = None, store: str | None = None) -> Settings:
    """Resolve settings from flags, environment and config file, in that order."""
    if config:
        path, explicit = Path(config).expanduser(), True
    elif os.environ.get(CONFIG_ENV):
        path, explicit = Path(os.environ[CONFIG_ENV]).expanduser(), True
    else:
        path, explicit = default_config_path(), False
    raw: dict[str, Any] = {}
    exists = os.path.lexists(path)
    if exists:
        what = "config file"
        hint = "give a TOML file of at most 1 MiB (see the README's config section), or drop --config / MREG_CONFIG"
        text = decode_text(read_input(path, what, limit=MAX_CONFIG, hint=hint), path, what, hint=hint)
        try:
            raw = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"config file {path} is not valid TOML: {e}", hint="fix or remove the file") from e
        except RecursionError:  # nesting deeper than the parser's stack
            raise UsageError(f"config file {path} is not valid TOML: nested too deeply",
                             hint="fix or remove the file") from None
    elif explicit:
        raise UsageError(f"config file {path} does not exist", hint="create it or drop --config / MREG_CONFIG")
    return Settings(
        config_path=path,
        config_exists=exists,
        cache_dir=_pick(cache_dir, CACHE_ENV, raw, "cache_dir", path),
        store=_pick(store, STORE_ENV, raw, "store", path),
        raw=raw,
    )


def _pick(flag: str | None, env: str, raw: dict[str, Any], key: str, path: Path) -> Setting:
    if flag:
        return Setting(flag, "flag")
    if os.environ.get(env):
        return Setting(os.environ[env], f"env {env}")
    value = raw.get(key)
    if isinstance(value, str) and value:
        return Setting(value, f"config {path}")
    return Setting(None, "unset")
