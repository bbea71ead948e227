"""`mreg ui` and `mreg site build`: the read-only web view of the store, live or as static files."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from registry import api
from registry.cli.options import any_store, config_option, json_option, settings_for, store_option
from registry.cli.render import Output
from registry.errors import NotFound

if TYPE_CHECKING:
    from registry.store.protocol import Store


@click.command("ui")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on. Loopback by default: anything else shows the store to the network.")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535), help="Port (0: any free).")
@click.option("--quiet", is_flag=True, help="No access log on stderr.")
@config_option
@store_option
@json_option
def ui_cmd(host: str, port: int, quiet: bool, config_path: str | None, store: str | None, as_json: bool) -> None:
    """Serve a read-only web view of the store: models, versions, history, comparisons (GET only, no JavaScript).

    Every page has a JSON twin (`index.json`, or `?format=json`) holding the document `--json`
    gives. With --json, one document saying where it listens is printed once it does (with
    --port 0, the port chosen). Stop it with Ctrl-C.
    """
    from registry.web.server import is_loopback, make_server

    settings = settings_for(config_path, store=store)
    st = _existing(any_store(settings))
    server = make_server(st, lambda name: api.trust_policy(settings, name), host, port, quiet)
    if not is_loopback(host):
        Output(False).warn(f"listening on {host}: anyone who can reach it can read the store's pages")
    sys.stderr.write(f"mreg ui: {server.url} (store {st.location}); Ctrl-C stops it\n")
    sys.stderr.flush()
    if as_json:
        Output(True).result({"url": server.url, "store": st.location}, "")
    try:
        server.serve_forever()
    except KeyboardInterrupt:  # Ctrl-C is how it is meant to stop: not an interrupted command
        sys.stderr.write("mreg ui: stopped\n")
    finally:
        server.server_close()


@click.group("site")
def site_group() -> None:
    """The web view as static files."""


@site_group.command("build")
@click.argument("out", type=click.Path(path_type=Path))
@config_option
@store_option
@json_option
def site_build_cmd(out: Path, config_path: str | None, store: str | None, as_json: bool) -> None:
    """Write every page of the web view (and its JSON) under OUT, for any web server or a file share.

    OUT is replaced as a whole (the new site is renamed into place); it must be new, empty, or a
    site built before. Links are relative: the site reads the same from file:// as from a server.
    """
    from registry.web.documents import Reader
    from registry.web.site import build

    settings = settings_for(config_path, store=store)
    st = _existing(any_store(settings))
    made = build(Reader(st, lambda name: api.trust_policy(settings, name)), out)
    Output(as_json).result({"out": str(made.out), "pages": made.pages, "files": made.files,
                            "seconds": round(made.seconds, 3)},
                           f"✓ {made.pages} pages ({made.files} files) in {made.out}, {made.seconds:.1f} s")


def _existing(st: Store) -> Store:
    if not st.is_store():
        raise NotFound(f"there is no store at {st.location}",
                       hint="check --store / MREG_STORE (`mreg config` shows which is used)")
    return st
