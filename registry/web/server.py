"""`mreg ui`: the pages served live from the store by the standard library's threading HTTP server.

Read-only by construction: GET and HEAD only (any other method is 405 before a handler runs), a
response is always a rendered page or its JSON, never a file of the store. Each request reads the
store afresh (a new `Reader`), so a promotion shows on the next load. Bound to loopback unless told
otherwise; there, a request whose Host header names another host is refused (a DNS-rebinding page
on the user's browser cannot read the store through it).
"""

from __future__ import annotations

import ipaddress
import socket
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, unquote, urlsplit

from registry.errors import UsageError
from registry.web import documents, pages

if TYPE_CHECKING:
    from registry.store.protocol import Store
    from registry.store.trust import TrustPolicy

ALLOWED = ("GET", "HEAD")
#: What every response says besides its body: the CSP, no sniffing, no referrer, no caching of a live view.
HEADERS = {"Content-Security-Policy": pages.CSP, "X-Content-Type-Options": "nosniff",
           "Referrer-Policy": "no-referrer", "Cache-Control": "no-store", "X-Frame-Options": "DENY"}
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """Whether `host` (a name or an address) is this machine only."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Handler(BaseHTTPRequestHandler):
    """Answers GET and HEAD with pages; everything else with 405."""

    server: UIServer
    server_version = "mreg-ui"
    sys_version = ""

    def parse_request(self) -> bool:
        """The request line and headers as the standard library reads them; then only GET and HEAD go on."""
        if not super().parse_request():
            return False
        if self.command not in ALLOWED:
            self._send(pages.Response(405, "text/plain; charset=utf-8", b"read-only: GET and HEAD only\n",
                                      {"Allow": ", ".join(ALLOWED)}))
            return False
        if self.server.loopback and not is_loopback(_host_name(self.headers.get("Host", ""))):
            self._send(pages.Response(421, "text/plain; charset=utf-8", b"this server answers for localhost only\n"))
            return False
        return True

    def do_GET(self) -> None:
        """A page."""
        self._send(self._respond(), body=True)

    def do_HEAD(self) -> None:
        """A page's headers."""
        self._send(self._respond(), body=False)

    def _respond(self) -> pages.Response:
        url = urlsplit(self.path)
        path = unquote(url.path)
        if not path.startswith("/") or "\\" in path or any(p in (".", "..") for p in path.split("/")):
            return pages.Response(400, "text/plain; charset=utf-8", b"bad path\n")
        rel = path.lstrip("/")
        if rel and not rel.endswith("/") and not rel.endswith((".html", ".json")):
            return pages.Response(301, "text/plain; charset=utf-8", b"", {"Location": path + "/"})
        if rel.endswith("/"):
            rel += "index.html"
        query = dict(parse_qsl(url.query))
        site = pages.Site(documents.Reader(self.server.store, self.server.trust), live=True)
        try:
            return site.respond(rel, query)
        except Exception as e:  # noqa: BLE001  (one page's unforeseen failure must not take the server down)
            self.log_error("error rendering %s: %s: %s", path, type(e).__name__, e)
            return pages.Response(500, "text/plain; charset=utf-8", b"internal error rendering this page\n")

    def _send(self, r: pages.Response, body: bool = True) -> None:
        self.send_response(r.status)
        for k, v in {**HEADERS, **r.headers, "Content-Type": r.content_type,
                     "Content-Length": str(len(r.body))}.items():
            self.send_header(k, v)
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(r.body)

    def log_message(self, format: str, *args: object) -> None:
        """Access log on stderr, unless quiet."""
        if not self.server.quiet:
            sys.stderr.write(f"{self.address_string()} - {format % args}\n")


def _host_name(header: str) -> str:
    host = header.strip()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class UIServer(ThreadingHTTPServer):
    """The threading HTTP server with the store it shows."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], store: Store, trust: Callable[[str], TrustPolicy],
                 quiet: bool = False) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, Handler)
        self.store, self.trust, self.quiet = store, trust, quiet
        self.loopback = is_loopback(address[0])

    @property
    def url(self) -> str:
        """Where the pages are."""
        host, port = str(self.server_address[0]), int(self.server_address[1])
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"


def make_server(store: Store, trust: Callable[[str], TrustPolicy], host: str = "127.0.0.1", port: int = 8080,
                quiet: bool = False) -> UIServer:
    """A server for the store's pages, bound and ready for `serve_forever()` (port 0: any free port)."""
    try:
        return UIServer((host, port), store, trust, quiet)
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                         hint="pick another --port, or stop what holds this one") from e
