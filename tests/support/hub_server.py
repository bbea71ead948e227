"""Self-contained local Hugging Face Hub server for tests (stdlib only).

Serves the subset of the Hub HTTP API that ``huggingface_hub`` 2.4 uses to read model repos:

* ``GET /api/models/{repo_id}`` and ``GET /api/models/{repo_id}/revision/{revision}`` (``?blobs=true``,
  ``?expand=...``, ``?securityStatus=true``),
* ``GET /api/models/{repo_id}/tree/{revision}[/{path}]`` (``?recursive=``, ``?expand=``; no pagination),
* ``POST /api/models/{repo_id}/paths-info/{revision}`` and ``GET /api/models/{repo_id}/refs``,
* ``HEAD``/``GET /{repo_id}/resolve/{revision}/{path}`` with ``Range`` support,
* ``HEAD``/``GET /cdn-lfs/...`` (only used when ``lfs_redirect=True``).

No ``X-Xet-*`` header is ever sent, so clients fall back to plain HTTP downloads.

Note: ``huggingface_hub`` reads ``HF_ENDPOINT``, ``HF_HUB_OFFLINE`` and ``HF_HUB_DISABLE_XET`` into
``huggingface_hub.constants`` at import time; pass ``endpoint=hub.endpoint`` explicitly (or patch the
constants) rather than setting environment variables after import.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import struct
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

__all__ = ["LFS_SUFFIXES", "LOGGED_HEADERS", "LocalHub"]

LFS_SUFFIXES = frozenset({".safetensors", ".bin", ".pt", ".gguf", ".onnx"})
"""File suffixes always stored as LFS, whatever their size."""

LOGGED_HEADERS = (
    "Range",
    "If-Range",
    "If-None-Match",
    "Accept-Encoding",
    "Authorization",
    "X-HF-Download-Counter",
)
"""Request headers recorded in ``LocalHub.requests`` (when present)."""

_CHUNK = 1024 * 1024
_COMMIT_RE = re.compile(r"[0-9a-f]{40}")
_RANGE_RE = re.compile(r"bytes=(\d*)-(\d*)")
_FLIP = bytes(b ^ 0xFF for b in range(256))
_API_SUBPATHS = frozenset({"revision", "tree", "refs", "paths-info", "resolve"})
_HashKey = tuple[str, int, int]


@dataclass(frozen=True)
class _Blob:
    """One file version: content (in memory or on disk) plus its git/LFS identifiers."""

    size: int
    git_oid: str
    sha256: str | None
    pointer_size: int | None
    data: bytes | None = None
    source: Path | None = None

    @property
    def etag(self) -> str:
        """Return the unquoted ETag the Hub serves: sha256 for LFS files, git blob sha1 otherwise."""
        return self.sha256 if self.sha256 is not None else self.git_oid


@dataclass
class _Commit:
    """A commit: its full file tree, parent, message and date."""

    sha: str
    parent: str | None
    message: str
    date: str
    tree: dict[str, _Blob]
    raw_paths: set[str] = field(default_factory=set)


@dataclass
class _Repo:
    """A model repo: commits by sha, branch heads, and the most recently created commit."""

    repo_id: str
    created_at: str
    commits: dict[str, _Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    latest: str | None = None


class _HubError(Exception):
    """An error response in the Hub's format (status, X-Error-Code, message)."""

    def __init__(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        """Store the response fields."""
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.commit = commit


def _now() -> str:
    """Return the current UTC time in the Hub's ISO format."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _git_blob_sha1(data: bytes) -> str:
    """Return the git blob id of ``data``."""
    return hashlib.sha1(b"blob %d\x00" % len(data) + data).hexdigest()


def _lfs_pointer(sha256: str, size: int) -> bytes:
    """Return the git-lfs pointer file for a blob."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


class _Server(ThreadingHTTPServer):
    """HTTP server bound to a LocalHub, tracking open connections so stop() can close them."""

    daemon_threads = True
    request_queue_size = 64

    def __init__(self, hub: LocalHub) -> None:
        """Bind 127.0.0.1 on a free port."""
        self.hub = hub
        self.open_sockets: set[socket.socket] = set()
        self.sockets_lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)

    def close_open_sockets(self) -> None:
        """Shut down every connection still open (e.g. idle keep-alive ones)."""
        with self.sockets_lock:
            sockets = list(self.open_sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    """Request handler dispatching to the owning LocalHub."""

    protocol_version = "HTTP/1.1"
    server_version = "LocalHub/1.0"
    timeout = 120

    def setup(self) -> None:
        """Register the connection with the server."""
        super().setup()
        server = self._server()
        with server.sockets_lock:
            server.open_sockets.add(self.connection)

    def finish(self) -> None:
        """Unregister the connection."""
        server = self._server()
        with server.sockets_lock:
            server.open_sockets.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def _server(self) -> _Server:
        """Return the typed server."""
        server = self.server
        assert isinstance(server, _Server)
        return server

    def log_message(self, format: str, *args: Any) -> None:
        """Silence the default stderr logging."""

    def do_GET(self) -> None:
        """Handle GET."""
        self._server().hub._handle(self, "GET")

    def do_HEAD(self) -> None:
        """Handle HEAD."""
        self._server().hub._handle(self, "HEAD")

    def do_POST(self) -> None:
        """Handle POST."""
        self._server().hub._handle(self, "POST")


class LocalHub:
    """In-process fake of the Hugging Face Hub, served on 127.0.0.1 from a background thread."""

    def __init__(self, *, lfs_redirect: bool = False) -> None:
        """Create an empty hub; with lfs_redirect, LFS files 302 to a 'CDN' origin (http://localhost:PORT)."""
        self.endpoint: str = ""
        self.lfs_redirect = lfs_redirect
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.bytes_sent: int = 0
        self._lock = threading.RLock()
        self._repos: dict[str, _Repo] = {}
        self._drops: dict[tuple[str, str], list[tuple[int, bool]]] = {}
        self._corrupt: set[tuple[str, str]] = set()
        self._announced: dict[tuple[str, str], int] = {}
        self._hash_cache: dict[_HashKey, tuple[int, str, str]] = {}
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> str:
        """Start serving on a free loopback port and return the endpoint URL."""
        if self._server is not None:
            raise RuntimeError("LocalHub already started")
        server = _Server(self)
        port = server.server_address[1]
        self.endpoint = f"http://127.0.0.1:{port}"
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="LocalHub",
            daemon=True,
        )
        self._thread.start()
        return self.endpoint

    def stop(self) -> None:
        """Stop serving and close all connections (idempotent)."""
        server, thread = self._server, self._thread
        self._server, self._thread = None, None
        if server is None:
            return
        server.shutdown()
        server.close_open_sockets()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def __enter__(self) -> LocalHub:
        """Start the hub."""
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the hub."""
        self.stop()

    # ------------------------------------------------------------------ content

    def add_commit(
        self,
        repo_id: str,
        files: Mapping[str, bytes | Path],
        *,
        branch: str = "main",
        lfs_threshold: int = 1024,
        message: str = "",
    ) -> str:
        """Create a commit whose complete tree is ``files`` on ``branch`` and return its sha."""
        tree = {path: self._make_blob(path, content, lfs_threshold) for path, content in files.items()}
        with self._lock:
            repo = self._repos.get(repo_id)
            if repo is None:
                repo = self._repos[repo_id] = _Repo(repo_id=repo_id, created_at=_now())
            parent = repo.branches.get(branch)
            digest = hashlib.sha1(b"tree\n")
            for path in sorted(tree):
                digest.update(f"{path}\x00{tree[path].git_oid}\n".encode())
            digest.update(f"parent {parent or ''}\nmessage {message}\n".encode())
            sha = digest.hexdigest()
            if sha not in repo.commits:
                repo.commits[sha] = _Commit(sha=sha, parent=parent, message=message, date=_now(), tree=tree)
            repo.branches[branch] = sha
            repo.latest = sha
            return sha

    def add_raw_sibling(self, repo_id: str, path: str, content: bytes) -> None:
        """Add a file with an arbitrary (unnormalised, possibly malicious) name to the repo's latest commit."""
        with self._lock:
            repo = self._repos.get(repo_id)
            if repo is None or repo.latest is None:
                self.add_commit(repo_id, {})
                repo = self._repos[repo_id]
            assert repo.latest is not None
            commit = repo.commits[repo.latest]
            commit.tree[path] = self._make_blob(path, content, 1024)
            commit.raw_paths.add(path)

    def _make_blob(self, path: str, content: bytes | Path, lfs_threshold: int) -> _Blob:
        """Hash content and build the blob record (LFS if large or a weights suffix)."""
        if isinstance(content, Path):
            size, sha256, git_oid = self._hash_file(content)
            data, source = None, content
        else:
            size, sha256 = len(content), hashlib.sha256(content).hexdigest()
            git_oid = _git_blob_sha1(content)
            data, source = bytes(content), None
        is_lfs = size >= lfs_threshold or os.path.splitext(path)[1].lower() in LFS_SUFFIXES
        if not is_lfs:
            return _Blob(
                size=size,
                git_oid=git_oid,
                sha256=None,
                pointer_size=None,
                data=data,
                source=source,
            )
        pointer = _lfs_pointer(sha256, size)
        return _Blob(
            size=size,
            git_oid=_git_blob_sha1(pointer),
            sha256=sha256,
            pointer_size=len(pointer),
            data=data,
            source=source,
        )

    def _hash_file(self, path: Path) -> tuple[int, str, str]:
        """Return (size, sha256, git blob sha1) of a file on disk, cached by (path, size, mtime)."""
        path = path.resolve()
        stat = path.stat()
        key: _HashKey = (str(path), stat.st_size, stat.st_mtime_ns)
        cached = self._hash_cache.get(key)
        if cached is not None:
            return cached
        sha256 = hashlib.sha256()
        sha1 = hashlib.sha1(b"blob %d\x00" % stat.st_size)
        size = 0
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                sha256.update(chunk)
                sha1.update(chunk)
                size += len(chunk)
        result = (size, sha256.hexdigest(), sha1.hexdigest())
        self._hash_cache[key] = result
        return result

    # ------------------------------------------------------------------ fault injection

    def drop_connection_after(
        self,
        repo_id: str,
        path: str,
        nbytes: int,
        times: int = 1,
        *,
        reset: bool = False,
    ) -> None:
        """Make the next ``times`` GETs send full headers, ``nbytes`` of body, then close (FIN; RST if reset)."""
        with self._lock:
            self._drops.setdefault((repo_id, path), []).extend([(nbytes, reset)] * times)

    def corrupt(self, repo_id: str, path: str) -> None:
        """Serve different bytes (same length) than the metadata describes."""
        with self._lock:
            self._corrupt.add((repo_id, path))

    def announce_size(self, repo_id: str, path: str, size: int) -> None:
        """Make all metadata claim ``size`` for the file; GETs of it then answer 500."""
        with self._lock:
            self._announced[(repo_id, path)] = size

    def reset_counters(self) -> None:
        """Clear the request log and the bytes_sent counter."""
        with self._lock:
            self.requests.clear()
            self.bytes_sent = 0

    # ------------------------------------------------------------------ request handling

    def _handle(self, h: _Handler, method: str) -> None:
        """Log and dispatch one request, turning _HubError into a Hub-style error response."""
        split = urlsplit(h.path)
        query = parse_qs(split.query, keep_blank_values=True)
        headers = {name: value for name in LOGGED_HEADERS if (value := h.headers.get(name)) is not None}
        with self._lock:
            self.requests.append((method, unquote(h.path), headers))
        body = b""
        if method == "POST":
            length = int(h.headers.get("Content-Length") or 0)
            body = h.rfile.read(length) if length else b""
        segs = split.path.lstrip("/").split("/")
        try:
            if segs[0] == "api" and len(segs) >= 3 and segs[1] == "models":
                self._handle_api(h, method, segs[2:], query, body)
            elif segs[0] == "cdn-lfs" and method in ("GET", "HEAD"):
                self._handle_cdn(h, method, query)
            elif method in ("GET", "HEAD") and "resolve" in segs[1:3]:
                self._handle_resolve(h, method, segs)
            else:
                raise _HubError(404, None, "Not Found")
        except _HubError as err:
            extra = {"X-Repo-Commit": err.commit} if err.commit else {}
            if err.code is not None:
                extra["X-Error-Code"] = err.code
            extra["X-Error-Message"] = err.message
            self._send_json(h, method, {"error": err.message}, status=err.status, extra=extra)

    def _split_repo(self, segs: list[str], marker: str | None) -> tuple[_Repo, list[str]]:
        """Split raw path segments into (repo, remaining segments); raise RepoNotFound if unknown."""
        with self._lock:
            if len(segs) >= 2 and unquote(f"{segs[0]}/{segs[1]}") in self._repos and segs[1] != marker:
                return self._repos[unquote(f"{segs[0]}/{segs[1]}")], segs[2:]
            if segs and unquote(segs[0]) in self._repos and (len(segs) == 1 or segs[1] in _API_SUBPATHS):
                return self._repos[unquote(segs[0])], segs[1:]
        raise _HubError(404, "RepoNotFound", "Repository not found")

    def _resolve_revision(self, repo: _Repo, revision: str) -> _Commit:
        """Resolve a branch name or full commit sha; raise RevisionNotFound otherwise."""
        with self._lock:
            sha = repo.branches.get(revision)
            if sha is None and _COMMIT_RE.fullmatch(revision) and revision in repo.commits:
                sha = revision
            if sha is None:
                raise _HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return repo.commits[sha]

    def _handle_api(
        self,
        h: _Handler,
        method: str,
        segs: list[str],
        query: dict[str, list[str]],
        body: bytes,
    ) -> None:
        """Serve /api/models/... endpoints."""
        repo, rest = self._split_repo(segs, None)
        with self._lock:
            payload = self._api_payload(method, repo, rest, query, body)
        self._send_json(h, method, payload)

    def _api_payload(
        self,
        method: str,
        repo: _Repo,
        rest: list[str],
        query: dict[str, list[str]],
        body: bytes,
    ) -> Any:
        """Build the JSON answer of an /api/models/{repo_id}/... endpoint (called with the hub lock held)."""
        if not rest and method == "GET":
            return self._model_info(repo, self._resolve_revision(repo, "main"), query)
        if len(rest) == 2 and rest[0] == "revision" and method == "GET":
            return self._model_info(repo, self._resolve_revision(repo, unquote(rest[1])), query)
        if len(rest) >= 2 and rest[0] == "tree" and method == "GET":
            commit = self._resolve_revision(repo, unquote(rest[1]))
            prefix = unquote("/".join(rest[2:])).strip("/")
            return self._tree(repo, commit, prefix, recursive=_flag(query, "recursive"), expand=_flag(query, "expand"))
        if len(rest) == 2 and rest[0] == "paths-info" and method == "POST":
            commit = self._resolve_revision(repo, unquote(rest[1]))
            form = parse_qs(body.decode(), keep_blank_values=True)
            return self._paths_info(repo, commit, form.get("paths", []), expand=_flag(form, "expand"))
        if rest == ["refs"] and method == "GET":
            return self._refs(repo, include_prs=bool(query.get("include_prs")))
        raise _HubError(404, None, "Not Found")

    def _handle_resolve(self, h: _Handler, method: str, segs: list[str]) -> None:
        """Serve HEAD/GET /{repo_id}/resolve/{revision}/{path}."""
        repo, rest = self._split_repo(segs, "resolve")
        if len(rest) < 3 or rest[0] != "resolve":
            raise _HubError(404, None, "Not Found")
        commit = self._resolve_revision(repo, unquote(rest[1]))
        path = unquote("/".join(rest[2:]))
        blob = commit.tree.get(path)
        if blob is None:
            raise _HubError(404, "EntryNotFound", "Entry not found", commit=commit.sha)
        key = (repo.repo_id, path)
        announced = self._announced.get(key)
        size = announced if announced is not None else blob.size
        headers = {
            "X-Repo-Commit": commit.sha,
            "ETag": f'"{blob.etag}"',
            "Accept-Ranges": "bytes",
            "Content-Disposition": _content_disposition(path),
        }
        if blob.sha256 is not None:
            headers["X-Linked-Etag"] = f'"{blob.sha256}"'
            headers["X-Linked-Size"] = str(size)
            if self.lfs_redirect:
                cdn = self.endpoint.replace("127.0.0.1", "localhost", 1)
                location = (
                    f"{cdn}/cdn-lfs/{blob.sha256}?repo={quote(repo.repo_id, safe='')}&path={quote(path, safe='')}"
                )
                headers["Location"] = location
                self._send_bytes(
                    h,
                    method,
                    b"Found. Redirecting to " + location.encode(),
                    status=302,
                    extra=headers,
                )
                return
        self._send_file(h, method, key, blob, size, headers)

    def _handle_cdn(self, h: _Handler, method: str, query: dict[str, list[str]]) -> None:
        """Serve the 'CDN' leg of an LFS redirect (content addressed, like the real CDN)."""
        repo_id = query.get("repo", [""])[0]
        path = query.get("path", [""])[0]
        sha256 = urlsplit(h.path).path.rsplit("/", 1)[-1]
        with self._lock:
            repo = self._repos.get(repo_id)
            commits = list(repo.commits.values()) if repo is not None else []
            blobs = [c.tree[path] for c in commits if path in c.tree and c.tree[path].sha256 == sha256]
        if not blobs:
            raise _HubError(404, None, "Not Found")
        blob = blobs[0]
        announced = self._announced.get((repo_id, path))
        size = announced if announced is not None else blob.size
        headers = {
            "ETag": f'"{blob.sha256}"',
            "Accept-Ranges": "bytes",
            "Content-Disposition": _content_disposition(path),
        }
        self._send_file(h, method, (repo_id, path), blob, size, headers)

    # ------------------------------------------------------------------ JSON payloads

    def _model_info(self, repo: _Repo, commit: _Commit, query: dict[str, list[str]]) -> dict[str, Any]:
        """Build the /api/models response for a commit."""
        blobs = _flag(query, "blobs")
        siblings: list[dict[str, Any]] = []
        for path in sorted(commit.tree):
            blob = commit.tree[path]
            sibling: dict[str, Any] = {"rfilename": path}
            if blobs:
                size = self._announced.get((repo.repo_id, path), blob.size)
                sibling["blobId"] = blob.git_oid
                sibling["size"] = size
                if blob.sha256 is not None:
                    sibling["lfs"] = {
                        "sha256": blob.sha256,
                        "size": size,
                        "pointerSize": blob.pointer_size,
                    }
            siblings.append(sibling)
        author = repo.repo_id.split("/")[0] if "/" in repo.repo_id else None
        info: dict[str, Any] = {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": author,
            "sha": commit.sha,
            "lastModified": commit.date,
            "createdAt": repo.created_at,
            "private": False,
            "disabled": False,
            "gated": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "spaces": [],
            "usedStorage": sum(b.size for b in commit.tree.values()),
        }
        if author is None:
            del info["author"]
        if _flag(query, "securityStatus"):
            info["securityRepoStatus"] = {"scansDone": True, "filesWithIssues": []}
        expand = [v for key in ("expand", "expand[]") for v in query.get(key, [])]
        if expand:
            info = {k: v for k, v in info.items() if k in {"_id", "id", *expand}}
        return info

    def _file_entry(self, repo: _Repo, commit: _Commit, path: str, *, expand: bool) -> dict[str, Any]:
        """Build a tree entry for a file."""
        blob = commit.tree[path]
        size = self._announced.get((repo.repo_id, path), blob.size)
        entry: dict[str, Any] = {
            "type": "file",
            "oid": blob.git_oid,
            "size": size,
            "path": path,
        }
        if blob.sha256 is not None:
            entry["lfs"] = {
                "oid": blob.sha256,
                "size": size,
                "pointerSize": blob.pointer_size,
            }
        if expand:
            entry["lastCommit"] = self._last_commit(repo, commit, path)
            entry["securityFileStatus"] = {
                "status": "safe",
                "avScan": {"virusFound": False, "virusNames": None},
                "pickleImportScan": None,
            }
        return entry

    def _dir_entry(self, repo: _Repo, commit: _Commit, path: str, *, expand: bool) -> dict[str, Any]:
        """Build a tree entry for a directory."""
        oid = hashlib.sha1(repr(_subtree(commit, path)).encode()).hexdigest()
        entry: dict[str, Any] = {
            "type": "directory",
            "oid": oid,
            "size": 0,
            "path": path,
        }
        if expand:
            entry["lastCommit"] = self._last_commit(repo, commit, path)
        return entry

    def _last_commit(self, repo: _Repo, commit: _Commit, path: str) -> dict[str, str]:
        """Return the last commit (reachable from ``commit``) that changed ``path``."""
        current = commit
        signature = _subtree(commit, path)
        while current.parent is not None:
            parent = repo.commits[current.parent]
            if _subtree(parent, path) != signature:
                break
            current = parent
        return {"id": current.sha, "title": current.message, "date": current.date}

    def _tree(
        self,
        repo: _Repo,
        commit: _Commit,
        prefix: str,
        *,
        recursive: bool,
        expand: bool,
    ) -> list[dict[str, Any]]:
        """List a directory of a commit (everything below it if recursive)."""
        with self._lock:
            files = [p for p in commit.tree if p not in commit.raw_paths]
            dirs = {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}
            if prefix and prefix not in dirs:
                raise _HubError(404, "EntryNotFound", f'{prefix} does not exist on "{commit.sha}"')
            base = f"{prefix}/" if prefix else ""

            def wanted(path: str) -> bool:
                if not path.startswith(base):
                    return False
                return recursive or "/" not in path[len(base) :]

            entries = [self._dir_entry(repo, commit, d, expand=expand) for d in sorted(dirs) if wanted(d)]
            entries += [self._file_entry(repo, commit, p, expand=expand) for p in sorted(files) if wanted(p)]
            if not prefix:
                entries += [self._file_entry(repo, commit, p, expand=expand) for p in sorted(commit.raw_paths)]
            return entries

    def _paths_info(self, repo: _Repo, commit: _Commit, paths: list[str], *, expand: bool) -> list[dict[str, Any]]:
        """Return entries for the given paths (missing ones are skipped, like the Hub)."""
        with self._lock:
            files = [p for p in commit.tree if p not in commit.raw_paths]
            dirs = {"/".join(p.split("/")[:i]) for p in files for i in range(1, p.count("/") + 1)}
            result: list[dict[str, Any]] = []
            for path in paths:
                if path in commit.tree:
                    result.append(self._file_entry(repo, commit, path, expand=expand))
                elif path.strip("/") in dirs:
                    result.append(self._dir_entry(repo, commit, path.strip("/"), expand=expand))
            return result

    def _refs(self, repo: _Repo, *, include_prs: bool) -> dict[str, Any]:
        """Return the /refs payload (branches only)."""
        with self._lock:
            branches = [
                {"name": name, "ref": f"refs/heads/{name}", "targetCommit": sha}
                for name, sha in sorted(repo.branches.items())
            ]
        refs: dict[str, Any] = {"branches": branches, "converts": [], "tags": []}
        if include_prs:
            refs["pullRequests"] = []
        return refs

    # ------------------------------------------------------------------ responses

    def _send_json(
        self,
        h: _Handler,
        method: str,
        payload: Any,
        *,
        status: int = 200,
        extra: dict[str, str] | None = None,
    ) -> None:
        """Send a JSON response."""
        headers = {"Content-Type": "application/json; charset=utf-8", **(extra or {})}
        self._send_bytes(h, method, json.dumps(payload).encode(), status=status, extra=headers)

    def _send_bytes(
        self,
        h: _Handler,
        method: str,
        body: bytes,
        *,
        status: int,
        extra: dict[str, str],
    ) -> None:
        """Send a small non-file response (HEAD: headers only)."""
        h.send_response(status)
        for name, value in extra.items():
            h.send_header(name, value)
        if "Content-Type" not in extra:
            h.send_header("Content-Type", "text/plain; charset=utf-8")
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if method != "HEAD":
            h.wfile.write(body)

    def _send_file(
        self,
        h: _Handler,
        method: str,
        key: tuple[str, str],
        blob: _Blob,
        size: int,
        headers: dict[str, str],
    ) -> None:
        """Send a file (or its requested range), applying injected faults on GET."""
        if method == "HEAD":
            h.send_response(200)
            for name, value in headers.items():
                h.send_header(name, value)
            h.send_header("Content-Type", "application/octet-stream")
            h.send_header("Content-Length", str(size))
            h.end_headers()
            return
        if size != blob.size:
            raise _HubError(500, None, "Internal Error: announced size does not match stored file")
        start, end = 0, blob.size - 1
        status = 200
        range_header = h.headers.get("Range")
        if range_header:
            match = _RANGE_RE.fullmatch(range_header.strip())
            parsed = _parse_range(match, blob.size) if match else None
            if parsed is None:
                self._send_bytes(
                    h,
                    method,
                    b"Requested Range Not Satisfiable",
                    status=416,
                    extra={**headers, "Content-Range": f"bytes */{blob.size}"},
                )
                return
            start, end = parsed
            status = 206
            headers = {**headers, "Content-Range": f"bytes {start}-{end}/{blob.size}"}
        length = end - start + 1
        with self._lock:
            drops = self._drops.get(key)
            limit, reset = drops.pop(0) if drops else (None, False)
            flip = key in self._corrupt
        h.send_response(status)
        for name, value in headers.items():
            h.send_header(name, value)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(length))
        h.end_headers()
        remaining = length if limit is None else min(limit, length)
        try:
            for chunk in _iter_blob(blob, start, remaining):
                if flip:
                    chunk = chunk.translate(_FLIP)
                h.wfile.write(chunk)
                with self._lock:
                    self.bytes_sent += len(chunk)
        except OSError:
            h.close_connection = True
            return
        if limit is not None:
            h.close_connection = True
            try:
                if reset:  # SO_LINGER 0 + close => the peer gets a TCP RST instead of a FIN
                    linger = struct.pack("ii", 1, 0)
                    h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                    h.rfile.close()
                    h.connection.close()
                else:
                    h.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _flag(query: dict[str, list[str]], name: str) -> bool:
    """Return whether a boolean query/form parameter is set to a truthy value."""
    values = query.get(name)
    if not values:
        return False
    return values[-1].lower() in ("1", "true", "yes", "")


def _parse_range(match: re.Match[str], size: int) -> tuple[int, int] | None:
    """Turn a parsed 'bytes=A-B' into an inclusive (start, end), or None if unsatisfiable."""
    first, last = match.group(1), match.group(2)
    if not first and not last:
        return None
    if not first:
        suffix = int(last)
        if suffix == 0 or size == 0:
            return None
        return max(size - suffix, 0), size - 1
    start = int(first)
    end = min(int(last), size - 1) if last else size - 1
    if start >= size or start > end:
        return None
    return start, end


def _iter_blob(blob: _Blob, start: int, length: int) -> Iterator[bytes]:
    """Yield ``length`` bytes of the blob from ``start`` in chunks of at most 1 MiB."""
    if blob.data is not None:
        view = memoryview(blob.data)
        for offset in range(start, start + length, _CHUNK):
            yield bytes(view[offset : min(offset + _CHUNK, start + length)])
        return
    assert blob.source is not None
    with blob.source.open("rb") as f:
        f.seek(start)
        remaining = length
        while remaining > 0:
            chunk = f.read(min(_CHUNK, remaining))
            if not chunk:
                break
            remaining -= len(chunk)
            yield chunk


def _subtree(commit: _Commit, path: str) -> list[tuple[str, str]]:
    """Return the sorted (path, oid) pairs of ``path`` and everything below it in a commit."""
    prefix = f"{path}/"
    return sorted((p, b.git_oid) for p, b in commit.tree.items() if p == path or p.startswith(prefix))


def _content_disposition(path: str) -> str:
    """Return the Content-Disposition header the Hub sends for a file."""
    name = path.rsplit("/", 1)[-1]
    ascii_name = name.encode("ascii", "replace").decode().replace('"', "_")
    return f"inline; filename*=UTF-8''{quote(name)}; filename=\"{ascii_name}\";"
