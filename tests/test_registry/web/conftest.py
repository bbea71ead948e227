"""The web view's fixtures: the small store (`support.web_store.small_store`), built once per module, and
`mreg ui` serving it on a free loopback port."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from support.web_store import WebStore, small_store

from registry import api
from registry.web.server import UIServer, make_server


@pytest.fixture(scope="module")
def web_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebStore]:
    """The small store (about a second to build)."""
    root = tmp_path_factory.mktemp("web")
    with pytest.MonkeyPatch.context() as mp:
        for var, sub in (("HOME", "home"), ("XDG_CONFIG_HOME", "home/.config"), ("HF_HOME", "home/hf"),
                         ("MREG_CACHE_DIR", "cache"), ("MREG_STORE", "store")):
            mp.setenv(var, str(root / sub))
        mp.setenv("MREG_USER", "alice")
        yield small_store(root)


@pytest.fixture(scope="module")
def live(web_store: WebStore) -> Iterator[UIServer]:
    """`mreg ui` on a free loopback port, in a thread."""
    settings = api.settings(store=str(web_store.store))
    server = make_server(api.open_store(web_store.store), lambda n: api.trust_policy(settings, n), port=0,
                         quiet=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
