"""Small hostile servers on 127.0.0.1 for the remotes' bounds (tests/hostile/test_remotes.py): an OCI registry that
serves a real layout mreg pushed, but lies about one blob (streams past its size, stops short, trickles), and an S3
endpoint whose listing never ends. The thing under test is mreg's bound, so the lie is all they need to get right."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any

#: What a lie does with a blob's true bytes: the chunks to send instead (sent without a Content-Length, then closed).
Lie = Callable[[bytes], Iterator[bytes]]


def past_the_end(data: bytes) -> Iterator[bytes]:
    """The blob, then zeros without end (the client must hang up)."""
    yield data
    while True:
        yield b"\0" * (1 << 16)


def trickle(data: bytes) -> Iterator[bytes]:
    """The blob ten bytes at a time, 20 times a second (200 bytes/s, for as long as the client listens)."""
    for at in range(0, len(data), 10):
        time.sleep(0.05)
        yield data[at:at + 10]


class _Server:
    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.host = f"127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        return self

    def stop(self) -> None:
        """Stop serving (connections in flight end when their client does)."""
        self.httpd.shutdown()
        self.httpd.server_close()

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


class LyingRegistry(_Server):
    """The OCI distribution pull endpoints over an image layout (`mreg push … oci-layout:DIR`), every blob as it is
    except `victim`, which `lie` replaces; `sizes` overrides descriptor sizes in the manifest it serves, and `rewrite`
    changes that manifest in place."""

    def __init__(self, layout: Path, tag: str, victim: str = "", lie: Lie = past_the_end,
                 sizes: dict[str, int] | None = None, rewrite: Callable[[dict[str, Any]], None] | None = None) -> None:
        index = json.loads((layout / "index.json").read_text())
        entry = next(m for m in index["manifests"] if m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        blob = lambda d: (layout / "blobs" / d.replace(":", "/")).read_bytes()  # noqa: E731
        manifest = json.loads(blob(entry["digest"]))
        for d in manifest["layers"]:
            d["size"] = (sizes or {}).get(d["digest"], d["size"])
        if rewrite is not None:  # e.g. what a copy by another tool does to the manifest
            rewrite(manifest)
        raw = json.dumps(manifest).encode()
        digest = "sha256:" + hashlib.sha256(raw).hexdigest()
        self.manifest_digest = digest
        manifests = {tag: raw, digest: raw}

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                m = re.fullmatch(r"/v2/(.+)/(manifests|blobs)/([^/?]+)", self.path)
                if self.path == "/v2/":
                    return self._send(200, b"{}", "application/json")
                if m is None:
                    return self._send(404, b"{}", "application/json")
                kind, ref = m.group(2), m.group(3)
                if kind == "manifests":
                    if ref not in manifests:
                        return self._send(404, b"{}", "application/json")
                    return self._send(200, manifests[ref], manifest["mediaType"])
                path = layout / "blobs" / ref.replace(":", "/")
                if not path.is_file():
                    return self._send(404, b"{}", "application/json")
                if ref != victim or self.command == "HEAD":
                    return self._send(200, path.read_bytes(), "application/octet-stream")
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                try:
                    for chunk in lie(path.read_bytes()):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass
                self.close_connection = True

            def _send(self, code: int, body: bytes, kind: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

        super().__init__(Handler)


class EndlessListing(_Server):
    """An S3 endpoint whose ListObjectsV2 always says more follows (a fresh continuation token each page); `pages`
    counts the pages served. With `slow_objects`, a GET of an object instead answers 1 MB, ten bytes at a time."""

    def __init__(self, *, slow_objects: bool = False) -> None:
        self.pages = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                if slow_objects and "list-type=2" not in self.path:
                    return self._trickle()
                outer.pages += 1
                body = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>"
                        "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">"
                        "<Name>b</Name><Prefix>models/</Prefix><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys>"
                        "<Delimiter>/</Delimiter><IsTruncated>true</IsTruncated>"
                        f"<NextContinuationToken>page-{outer.pages}</NextContinuationToken>"
                        "</ListBucketResult>").encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _trickle(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(10**6))
                self.send_header("ETag", '"0"')
                self.end_headers()
                try:
                    for chunk in trickle(b" " * 10**6):
                        self.wfile.write(chunk)
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass

        super().__init__(Handler)
