"""Options every command family shares, and the objects they stand for (settings, stores, progress)."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import click

from registry import api
from registry.cli.render import BarProgress
from registry.config import HF_ENDPOINT, Settings
from registry.errors import UsageError

if TYPE_CHECKING:  # boto3 loads with the S3 store only: `mreg --help` stays fast
    from registry.store.local import LocalStore
    from registry.store.protocol import Store
    from registry.store.s3 import S3Store

F = TypeVar("F", bound=Callable[..., Any])

if TYPE_CHECKING:  # click 8.5 made ParamType generic; older clicks cannot subscript it at run time
    _IntParam = click.ParamType[int, Any]
    _FloatParam = click.ParamType[float, Any]
else:
    _IntParam = _FloatParam = click.ParamType

_WHOLE = re.compile(r"\A-?[0-9]{1,18}\Z")
_DECIMAL = re.compile(r"\A[+-]?(?:[0-9]{1,18}(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]{1,3})?\Z")


def _refuse(param: click.Parameter | None, ctx: click.Context | None, what: str, value: Any) -> NoReturn:
    """A number option's refusal as mreg's own usage error (one line and a hint, exit 2), not click's usage text:
    the same answer the option's own checks in the library give."""
    flag = param.opts[0] if param is not None and param.opts else "the option"
    command = ctx.info_name if ctx is not None and ctx.info_name else "COMMAND"
    raise UsageError(f"{flag} takes {what}, not {value!r}", hint=f"see `mreg {command} --help`")


class WholeNumber(_IntParam):
    """A whole number in ASCII digits (Python's int() also takes '١' and '²'), at least `low`."""

    name = "integer"

    def __init__(self, low: int = 0) -> None:
        self.low = low

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """The number, or a usage error naming the option."""
        what = f"a whole number of {self.low} or more in ASCII digits"
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif isinstance(value, str) and _WHOLE.match(value.strip()):
            number = int(value.strip())
        else:
            _refuse(param, ctx, what, value)
        if number < self.low:
            _refuse(param, ctx, what, value)
        return number


class FiniteNumber(_FloatParam):
    """A finite decimal number in ASCII (no nan, inf or 1e400), within [low, high]; `open_low` excludes low."""

    name = "number"

    def __init__(self, low: float = 0.0, high: float = 1e12, *, open_low: bool = False) -> None:
        self.low, self.high, self.open_low = low, high, open_low

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        """The number, or a usage error naming the option and the range."""
        low, high = f"{self.low:,.15g}", f"{self.high:,.15g}"
        what = f"a number above {low} and at most {high}" if self.open_low else f"a number from {low} to {high}"
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str) and _DECIMAL.match(value.strip()):
            number = float(value.strip())
        else:
            _refuse(param, ctx, what, value)
        below = number <= self.low if self.open_low else number < self.low
        if not math.isfinite(number) or below or number > self.high:
            _refuse(param, ctx, what, value)
        return number


#: ctx.meta keys: options that the error boundary and the store factories read.
JSON_KEY = "mreg.json"
ENDPOINT_KEY = "mreg.endpoint_url"
#: The alias-change notifiers this command's stores carry: the error boundary waits for them and warns.
EVENTS_KEY = "mreg.events"


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta[JSON_KEY] = True
    return value


def json_option(f: F) -> F:
    """`--json`: one JSON document on stdout, no progress bars."""
    return click.option("--json", "as_json", is_flag=True, is_eager=True, callback=_set_json,
                        help="Print one JSON document (with schema_version) instead of text; no progress bars.")(f)


def config_option(f: F) -> F:
    """`--config`."""
    return click.option("--config", "config_path", metavar="FILE",
                        help="Config file (TOML). Default: $XDG_CONFIG_HOME/mreg/config.toml.")(f)


def _set_endpoint(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.meta[ENDPOINT_KEY] = value


def endpoint_option(f: F) -> F:
    """`--endpoint-url` (for commands whose store is named elsewhere, e.g. in a matrix file)."""
    return click.option("--endpoint-url", metavar="URL", expose_value=False, callback=_set_endpoint,
                        help="S3 endpoint for s3:// stores (else $AWS_ENDPOINT_URL; AWS when unset).")(f)


def store_option(f: F) -> F:
    """`--store` and `--endpoint-url`."""
    f = endpoint_option(f)
    return click.option("--store", metavar="DIR|s3://BUCKET/PREFIX",
                        help="Store: a directory or s3://bucket/prefix. Else $MREG_STORE, else `store` in the "
                             "config file.")(f)


def cache_option(f: F) -> F:
    """`--cache-dir`."""
    return click.option("--cache-dir", metavar="DIR",
                        help="Cache root. Else $MREG_CACHE_DIR, else `cache_dir` in the config file.")(f)


#: `--endpoint`: the hub's URL, else $HF_ENDPOINT (read through the catalogue, not by click), else the hub's default.
hub_endpoint_option = click.option("--endpoint", default=HF_ENDPOINT.value, metavar="URL",
                                   help="Hub endpoint (default $HF_ENDPOINT).")

insecure_option = click.option(
    "--insecure", is_flag=True,
    help="OCI: plain HTTP, allowed only for a registry on this machine (loopback test registries).")


def pull_options(f: F) -> F:
    """Options shared by pull and convert."""
    for opt in reversed([
        click.option("--include", multiple=True, metavar="GLOB", help="Only files matching (repeatable)."),
        click.option("--exclude", multiple=True, metavar="GLOB", help="Skip files matching (repeatable)."),
        click.option("--allow-pickle", is_flag=True,
                     help="Also fetch pickle weights (.bin/.pt/.pth/.ckpt/.pkl); they can run code when loaded."),
        click.option("--offline", is_flag=True, help="Use only the cache; never contact the hub."),
        hub_endpoint_option,
        insecure_option,
    ]):
        f = opt(f)
    return f


def settings_for(config_path: str | None, cache_dir: str | None = None, store: str | None = None) -> Settings:
    """The settings these flags, the environment and the config file give."""
    return api.settings(config_path, cache_dir, store)


def _endpoint() -> str | None:
    value = click.get_current_context().meta.get(ENDPOINT_KEY)
    return str(value) if value else None


def local_store(settings: Settings) -> LocalStore:
    """The store, which this command needs on the local filesystem."""
    return _announcing(api.open_local_store(settings.require_store()), settings)


def s3_store(url: str) -> S3Store:
    """An S3 store named on the command line."""
    return api.open_s3_store(url, endpoint_url=_endpoint())


def store_at(location: str) -> Store:
    """The store at a location named outside the settings (a matrix file's `store`), with --endpoint-url."""
    return api.open_store(location, endpoint_url=_endpoint())


def any_store(settings: Settings) -> Store:
    """The store, local or S3."""
    return _announcing(api.open_store(settings.require_store(), endpoint_url=_endpoint()), settings)


S = TypeVar("S", "LocalStore", "Store")


def _announcing(store: S, settings: Settings) -> S:
    """The store, with the config file's `[events]` URLs told of every alias change it commits."""
    from registry.release.events import notifier

    n = notifier(settings.raw, store.location, store.keep_undelivered)
    if n is not None:
        store.listeners.append(n)
        click.get_current_context().meta.setdefault(EVENTS_KEY, []).append(n)
    return store


def progress_for(as_json: bool) -> BarProgress:
    """Bars on stderr when it is a terminal and the output is for people."""
    return BarProgress(enabled=not as_json and sys.stderr.isatty())


def quiet_hub(as_json: bool) -> None:
    """huggingface_hub's own bars only where mreg would draw its own."""
    if as_json or not sys.stderr.isatty():
        from huggingface_hub import utils as hf_utils

        hf_utils.disable_progress_bars()  # type: ignore[attr-defined]
