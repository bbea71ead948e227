"""Where the cache and the store are: flag, then environment, then config file; never a silent default.

This module is also the catalogue of every environment variable mreg reads, and the only module that reads the
process environment: a variable is declared once here (its name, what it does, its default) and read through its
declaration, so `mreg config --env` and docs/reference/environment.md can list them all and none is spelled twice.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.errors import UsageError
from registry.inputs import decode_text, kind, read_input

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


@dataclass(frozen=True)
class Variable:
    """An environment variable mreg reads: its name, what it does, the value that holds when it is unset (None
    where no one value does: `meaning` says what happens then) and the config file's key that stands in for it."""

    name: str
    meaning: str
    default: str | None = None
    config_key: str | None = None

    def value(self) -> str | None:
        """Its value in this process's environment; an empty value is no value (as a shell's `VAR=` means)."""
        return os.environ.get(self.name) or None


MREG_CACHE_DIR = Variable("MREG_CACHE_DIR", "the cache directory (hub snapshots, pull records); --cache-dir wins over "
                          "it; unset: cache_dir in the config file", config_key="cache_dir")
MREG_STORE = Variable("MREG_STORE", "the store, a directory or s3://bucket/prefix; --store wins over it; unset: store "
                      "in the config file", config_key="store")
MREG_CONFIG = Variable("MREG_CONFIG", "the config file; --config wins over it; unset: "
                       "$XDG_CONFIG_HOME/mreg/config.toml, which may be absent")
MREG_USER = Variable("MREG_USER", "who is recorded in every record mreg writes (history, versions, pulls, checks, "
                     "signatures); unset: the login name, else uid:<n>")
MREG_DEBUG = Variable("MREG_DEBUG", "any value: an error prints its traceback after the error line and hint")
MREG_GGUF_QUANTIZER = Variable("MREG_GGUF_QUANTIZER", "which encoders write GGUF blocks: numpy, ggml or auto "
                               "(the fastest here)", "auto")
MREG_GGUF_DIRECT_IO = Variable("MREG_GGUF_DIRECT_IO", "1 writes GGUF files around the page cache, 0 never does; "
                               "unset: decided per file by its size and the machine's memory")
MREG_STALL_BYTES = Variable("MREG_STALL_BYTES", "the least a remote transfer must bring in each window, in bytes "
                            "(0: no floor)", "1048576")
MREG_STALL_SECONDS = Variable("MREG_STALL_SECONDS", "the window of that floor, in seconds", "60")
MREG_LEASE_SECONDS = Variable("MREG_LEASE_SECONDS", "how long a conversion's lease lives without a renewal, in "
                              "seconds (0.5 to 86400)", "60")
MREG_MAX_LIST_PAGES = Variable("MREG_MAX_LIST_PAGES", "the most pages one S3 listing may take", "10000")
HF_ENDPOINT = Variable("HF_ENDPOINT", "the hub's URL for pull, convert and plan (--endpoint's default)",
                       "https://huggingface.co")
XDG_CONFIG_HOME = Variable("XDG_CONFIG_HOME", "where the default config file lives; unset: ~/.config")
REGISTRY_AUTH_FILE = Variable("REGISTRY_AUTH_FILE", "OCI registry credentials (podman's and skopeo's auth file); "
                              "unset: $DOCKER_CONFIG/config.json")
DOCKER_CONFIG = Variable("DOCKER_CONFIG", "the directory of Docker's config.json (OCI credentials); unset: ~/.docker")

#: Every variable mreg reads by a fixed name, in the order `mreg config --env` and the docs list them. (huggingface_hub
#: and boto3 read their own, HF_TOKEN and AWS_* among them; `sign --password-env` names one at run time.)
VARIABLES = (MREG_CACHE_DIR, MREG_STORE, MREG_CONFIG, MREG_USER, MREG_DEBUG, MREG_GGUF_QUANTIZER, MREG_GGUF_DIRECT_IO,
             MREG_STALL_BYTES, MREG_STALL_SECONDS, MREG_LEASE_SECONDS, MREG_MAX_LIST_PAGES, HF_ENDPOINT,
             XDG_CONFIG_HOME, REGISTRY_AUTH_FILE, DOCKER_CONFIG)

CACHE_ENV = MREG_CACHE_DIR.name
STORE_ENV = MREG_STORE.name
CONFIG_ENV = MREG_CONFIG.name


def named(name: str) -> str | None:
    """The variable a user named at run time (`mreg sign --password-env VAR`); empty is no value."""
    return os.environ.get(name) or None


def inherited(**extra: str) -> dict[str, str]:
    """This process's environment with `extra` over it: what a child mreg starts (a hook, a converter's worker) gets."""
    return {**os.environ, **extra}


def python_path(first: Path) -> str:
    """A PYTHONPATH for a child that runs mreg's code: `first`, then this process's own PYTHONPATH."""
    return os.pathsep.join(filter(None, [str(first), os.environ.get("PYTHONPATH")]))


#: ASCII numbers as environment settings take them (float() and int() also take '١٢٠', 'nan' and '1e999').
WHOLE = re.compile(r"[0-9]{1,15}")
SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{1,6})?")


def env_number(variable: Variable, pattern: re.Pattern[str], what: str) -> str:
    """The variable's value (else its default) when it fully matches `pattern`; a UsageError saying it must be
    `what` otherwise. The one reader of mreg's numeric settings from the environment."""
    value = (variable.value() or "").strip() or variable.default or ""
    if not pattern.fullmatch(value):
        shown = value[:40] if value.isascii() and value.isprintable() else repr(value[:40])
        raise UsageError(f"{variable.name}={shown} is not {what}", hint=f"set {variable.name} to {what}, or unset it")
    return value


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
    base = XDG_CONFIG_HOME.value() or str(Path.home() / ".config")
    return Path(base) / "mreg" / "config.toml"


def load(config: str | None = None, cache_dir: str | None = None, store: str | None = None) -> Settings:
    """Resolve settings from flags, environment and config file, in that order."""
    named_file = config or MREG_CONFIG.value()
    path, explicit = (Path(named_file).expanduser(), True) if named_file else (default_config_path(), False)
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
        cache_dir=Setting(cache_dir, "flag") if cache_dir else resolve(MREG_CACHE_DIR, raw, path),
        store=Setting(store, "flag") if store else resolve(MREG_STORE, raw, path),
        raw=raw,
    )


def model_table(raw: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The config file's `[models.NAME]` table ({} when it has none), from its contents `raw`: the one reader of it.
    Promotion hooks and requirements (registry.release.hooks), the trust policy (registry.store.trust) and the
    rollout (registry.release.rollout) each take their keys from it."""
    models = raw.get("models", {})
    table = models.get(name, {}) if isinstance(models, dict) else None
    if not isinstance(table, dict):
        raise UsageError(f"[models.{name}] in the config file is not a table", hint="see the README's config section")
    return table


def resolve(variable: Variable, raw: Mapping[str, Any], path: Path) -> Setting:
    """The variable's value and its origin: the environment, then the config file `raw` read from `path` (for a
    variable with a config key), then its default; "unset" when none gives one."""
    if value := variable.value():
        return Setting(value, f"env {variable.name}")
    given = raw.get(variable.config_key) if variable.config_key else None
    if isinstance(given, str) and given:
        return Setting(given, f"config {path}")
    return Setting(variable.default, "default") if variable.default is not None else Setting(None, "unset")
