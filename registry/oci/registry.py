"""An OCI distribution registry over HTTP (the distribution spec's pull and push endpoints).

Client: httpx2, which mreg already depends on through huggingface_hub. It streams request and
response bodies (no blob is ever held in memory), gives the exact control the protocol needs
(HEAD before upload, monolithic or chunked POST → PATCH… → PUT ?digest= uploads, the digest of
the manifest bytes as sent) and adds no dependency. `oras` (oras-py) was measured beside it
(`benchmarks/bench_oci.py`): no faster, its default push holds a whole file in memory, its pull
checks no digest, it titles layers by basename, and its chunked upload cannot resume; it would need
wrapping at every step we care about (skipping present blobs, manifest last, typed errors, resumable
sessions), so the protocol here is small enough to own.

Chunked uploads resume: `uploads` keeps each session in the store's tmp/; `_resume` asks the
registry where it stands (`GET` → `Range`) and `_send_chunks` continues from there; `stop` (set by
the CLI on SIGINT/SIGTERM) ends a push between chunks, where distribution can still resume it.

Authentication: the first 401 names a challenge (`auth`); a bearer token is fetched for the
repository's `pull,push` scope and kept for the session; basic credentials are sent as asked.
Bodies are produced by callables so a request answered 401 is sent again from its first byte.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import json
import re
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx2

from registry.errors import CredentialsRefused, IntegrityError, Interrupted, NotFound, StoreUnreachable, UsageError
from registry.incoming import stall_floor, unstalled
from registry.oci import auth, media, referrers
from registry.oci.reference import OciRef
from registry.oci.target import BlobBody, FetchedManifest, read_capped
from registry.oci.uploads import UploadSessions

#: Blobs up to this size go in one PUT; larger ones in PATCH chunks of `CHUNK` bytes.
MONOLITHIC_MAX = 64 << 20
CHUNK = 32 << 20
READ = 1 << 20
#: A referrers list longer than this many pages is not read further (each page is up to MAX_MANIFEST).
MAX_REFERRER_PAGES = 64
ACCEPT = ", ".join((media.OCI_MANIFEST, media.OCI_INDEX, media.DOCKER_MANIFEST))
Body = Callable[[], Iterable[bytes]] | bytes | None


def _file_body(path: BlobBody, start: int = 0, length: int | None = None) -> Callable[[], Iterator[bytes]]:
    if not isinstance(path, Path):  # bytes made on the fly (an image's tar layer)
        source = path
        return lambda: source.chunks(start, length)
    file = path

    def chunks() -> Iterator[bytes]:
        left = length
        with open(file, "rb") as f:
            f.seek(start)
            while left is None or left > 0:
                block = f.read(READ if left is None else min(READ, left))
                if not block:
                    return
                if left is not None:
                    left -= len(block)
                yield block
    return chunks


def _loopback(host: str) -> bool:
    """Whether a bare host name (no port) is this machine."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class RegistryTarget:
    """One repository of a registry, as a push or pull `Target`."""

    def __init__(self, ref: OciRef, *, insecure: bool = False, chunk: int = CHUNK,
                 monolithic_max: int = MONOLITHIC_MAX, sessions: Path | None = None,
                 stop: threading.Event | None = None) -> None:
        if insecure and not ref.is_loopback:
            raise UsageError(f"--insecure (plain HTTP) is only allowed for a registry on this machine, not {ref.host}",
                             hint="use TLS; plain HTTP is for loopback test registries")
        self.ref = ref
        self.location = f"{ref.host}/{ref.repository}"
        self.base = f"{'http' if insecure else 'https'}://{ref.host}/v2/{ref.repository}/"
        self.chunk, self.monolithic_max = chunk, monolithic_max
        self.origin = f"{'http' if insecure else 'https'}://{ref.host}/"
        self.sessions = UploadSessions(sessions, self.location) if sessions is not None else None
        self.stop = stop  # set: end the push at the next blob or chunk boundary (a resumable point)
        self.floor = stall_floor()
        self.http = httpx2.Client(timeout=httpx2.Timeout(self.floor.read_timeout, connect=10.0), follow_redirects=True)
        self._creds: auth.Credentials | None = None
        self._creds_loaded = False
        self._authorization: str | None = None

    # -- requests, authentication and errors ------------------------------------------------------

    def _credentials(self) -> auth.Credentials | None:
        if not self._creds_loaded:
            self._creds, self._creds_loaded = auth.lookup(self.ref.host), True
        return self._creds

    def _send(self, method: str, url: str, *, body: Body = None, headers: dict[str, str] | None = None,
              stream: bool = False) -> httpx2.Response:
        """One request, authenticated on the first 401 and sent once more; transport errors are one line."""
        for attempt in (0, 1):
            hdrs = dict(headers or {})
            if self._authorization:
                hdrs["Authorization"] = self._authorization
            content = body() if callable(body) else body
            try:
                req = self.http.build_request(method, url, content=content, headers=hdrs)
                resp = self.http.send(req, stream=stream)
            except httpx2.HTTPError as e:
                raise StoreUnreachable(f"{self.ref.host}: {type(e).__name__}: {e}",
                                       hint="check the registry address, and --insecure for a plain-HTTP "
                                            "registry on this machine") from None
            if resp.status_code != 401 or attempt:
                return self._checked_auth(resp)
            resp.read()
            resp.close()
            self._authorization = self._answer(resp.headers.get("www-authenticate", ""))
        raise AssertionError("unreachable")

    def _checked_auth(self, resp: httpx2.Response) -> httpx2.Response:
        if resp.status_code in (401, 403):
            resp.read()
            have = self._credentials() is not None
            what = "refused the credentials" if have else "needs credentials and none were found"
            raise CredentialsRefused(
                f"{self.ref.host} {what} for {self.ref.repository} (HTTP {resp.status_code})",
                hint=(f"check the entry for {self.ref.host} in {auth.auth_file()} (`skopeo login {self.ref.host}`)"
                      if have else f"log in first (`skopeo login {self.ref.host}`) or set REGISTRY_AUTH_FILE"))
        return resp

    def _answer(self, header: str) -> str | None:
        """The Authorization value that answers a challenge (None when there is nothing to answer with)."""
        challenge = auth.parse_challenge(header)
        creds = self._credentials()
        if challenge is None:
            return None
        if challenge.scheme == "basic":
            return auth.basic_header(creds) if creds else None
        if challenge.scheme != "bearer" or "realm" not in challenge.params:
            return None
        realm = urlsplit(challenge.params["realm"])
        if creds and realm.scheme != "https" and not (realm.scheme == "http" and _loopback(realm.hostname or "")):
            raise CredentialsRefused(f"{self.ref.host} asks for the credentials at a token service that is not "
                                     f"HTTPS ({realm.scheme}://{realm.netloc}); not sent",
                                     hint="configure the registry's auth realm with https:// (plain HTTP only on "
                                          "this machine)")
        scope = f"repository:{self.ref.repository}:pull,push"
        params = {"scope": scope, **({"service": challenge.params["service"]} if "service" in challenge.params else {})}
        hdrs = {"Authorization": auth.basic_header(creds)} if creds and creds.username != "<token>" else {}
        try:
            if creds and creds.username == "<token>":  # an identity token is exchanged by OAuth2
                resp = self.http.post(challenge.params["realm"], data={
                    "grant_type": "refresh_token", "refresh_token": creds.secret, "scope": scope,
                    "service": challenge.params.get("service", ""), "client_id": "mreg"})  # client_id: required
            else:
                resp = self.http.get(challenge.params["realm"], params=params, headers=hdrs)
        except httpx2.HTTPError as e:
            raise StoreUnreachable(f"the token service of {self.ref.host}: {type(e).__name__}",
                                   hint="check that the registry's auth realm is reachable") from None
        if resp.status_code in (401, 403) and creds is None:
            raise CredentialsRefused(f"the token service of {self.ref.host} needs credentials and none were found "
                                     f"(HTTP {resp.status_code})",
                                     hint=f"log in first (`skopeo login {self.ref.host}`) or set REGISTRY_AUTH_FILE")
        if resp.status_code in (401, 403):
            raise CredentialsRefused(f"the token service of {self.ref.host} refused the credentials "
                                     f"(HTTP {resp.status_code})",
                                     hint=f"check the entry for {self.ref.host} in {auth.auth_file()}")
        try:
            doc = resp.json()
            token = doc.get("token") or doc.get("access_token")
        except ValueError:
            token = None
        if resp.status_code != 200 or not token:
            raise StoreUnreachable(f"the token service of {self.ref.host} answered HTTP {resp.status_code} "
                                   "without a token", hint="check the registry's auth configuration")
        return f"Bearer {token}"

    def _fail(self, resp: httpx2.Response, what: str) -> StoreUnreachable | IntegrityError:
        """The error an unexpected answer means: a digest the registry refused is an integrity failure."""
        try:
            errors = [e.get("code", "") for e in json.loads(resp.read() or b"{}").get("errors", [])]
        except (ValueError, AttributeError, httpx2.HTTPError):
            errors = []
        detail = f"HTTP {resp.status_code}" + (f" {', '.join(errors)}" if errors else "")
        if "DIGEST_INVALID" in errors:
            return IntegrityError(f"{self.location} refused {what}: {detail} (its bytes do not match its digest)",
                                  hint="run `mreg verify --all`: the local blob may be damaged")
        return StoreUnreachable(f"{self.location}: {what} failed: {detail}", hint="see the registry's logs")

    # -- the Target protocol -----------------------------------------------------------------------

    def blob_size(self, digest: str) -> int | None:
        """The size the registry gives for a blob it has, or None."""
        resp = self._send("HEAD", f"{self.base}blobs/{digest}")
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise self._fail(resp, f"HEAD blob {digest[:19]}…")
        return int(resp.headers.get("content-length", "-1"))

    def upload_blob(self, digest: str, size: int, path: BlobBody, advance: Callable[[int], None]) -> int:
        """One PUT (small), or PATCH chunks and a closing PUT (large), each streamed; a chunked upload resumes
        the session a killed push left. Returns how many bytes the registry already had from that session."""
        self._check_stop(digest, 0, size)
        with self.sessions.claim(digest) if self.sessions is not None else contextlib.nullcontext(False) as mine:
            # Another push sending this blob here now holds its session: upload on our own, recording nothing
            # (two writers on one distribution session cancel it).
            sessions = self.sessions if mine else None
            resumed = self._resume(sessions, digest, size)  # whatever the chunk size now: the session has bytes
            if resumed is not None and self._send_chunks(sessions, digest, size, path, *resumed, advance):
                return resumed[1]
            if size <= self.monolithic_max:
                url = self._start_upload(None, digest, size)
                resp = self._send("PUT", self._with_digest(url, digest), body=_file_body(path),
                                  headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
                if resp.status_code != 201:
                    raise self._fail(resp, f"blob {digest[:19]}…")
                advance(size)
                return 0
            url = self._start_upload(sessions, digest, size)
            self._send_chunks(sessions, digest, size, path, url, 0, advance)  # a fresh session: never False
            return 0

    def _start_upload(self, sessions: UploadSessions | None, digest: str, size: int) -> str:
        resp = self._send("POST", f"{self.base}blobs/uploads/", headers={"Content-Length": "0"})
        if resp.status_code != 202:
            raise self._fail(resp, "starting an upload")
        url = self._location(resp)
        if sessions is not None:
            sessions.save(digest, size, url, 0)
        return url

    def _resume(self, sessions: UploadSessions | None, digest: str, size: int) -> tuple[str, int] | None:
        """Where a saved session stands on the registry (`GET` → 204, `Range: 0-N`): its URL and offset N+1."""
        session = sessions.load(digest, size) if sessions is not None else None
        if session is None or sessions is None:
            return None
        if not session.location.startswith(self.origin):  # never send our Authorization elsewhere
            sessions.drop(digest)
            return None
        resp = self._send("GET", session.location)
        resp.read()
        m = re.fullmatch(r"0-([0-9]+)", resp.headers.get("range", "").strip())
        if resp.status_code != 204 or m is None or not resp.headers.get("location"):
            sessions.drop(digest)  # unknown (404), expired, or its state no longer matches (400)
            return None
        end = int(m.group(1))
        offset = 0 if end == 0 and session.confirmed == 0 else end + 1  # "0-0" also means nothing yet
        if offset > size:
            sessions.drop(digest)
            return None
        url = self._location(resp)
        sessions.save(digest, size, url, offset)
        return url, offset

    def _send_chunks(self, sessions: UploadSessions | None, digest: str, size: int, path: BlobBody, url: str,
                     offset: int, advance: Callable[[int], None]) -> bool:
        """PATCH from `offset`, recording each confirmed chunk, then PUT ?digest=. False: a resumed session is gone
        (nothing was counted)."""
        for start in range(offset, size, self.chunk):
            self._check_stop(digest, start, size)
            n = min(self.chunk, size - start)
            resp = self._send("PATCH", url, body=_file_body(path, start, n), headers={
                "Content-Type": "application/octet-stream", "Content-Length": str(n),
                "Content-Range": f"{start}-{start + n - 1}"})
            if resp.status_code in (400, 404, 416) and start == offset and offset:
                resp.read()
                if sessions is not None:
                    sessions.drop(digest)
                return False  # the registry forgot the session between our GET and this PATCH
            if resp.status_code != 202:
                raise self._fail(resp, f"a chunk of blob {digest[:19]}…")
            url = self._location(resp)
            if sessions is not None:
                sessions.save(digest, size, url, start + n)  # before the progress hears of it
            advance(n + (offset if start == offset else 0))
        if offset == size:
            advance(offset)
        resp = self._send("PUT", self._with_digest(url, digest), headers={"Content-Length": "0"})
        if resp.status_code != 201:
            raise self._fail(resp, f"blob {digest[:19]}…")
        if sessions is not None:
            sessions.drop(digest)
        return True

    def _check_stop(self, digest: str, confirmed: int, size: int) -> None:
        if self.stop is not None and self.stop.is_set():
            raise Interrupted(f"push to {self.location} stopped as asked, at {confirmed} of {size} bytes of blob "
                              f"{digest[:19]}…; nothing is tagged",
                              hint="run the same push again: it resumes there")

    def _location(self, resp: httpx2.Response) -> str:
        loc = resp.headers.get("location")
        if not loc:
            raise StoreUnreachable(f"{self.location}: an upload answer has no Location", hint="see the registry's logs")
        return urljoin(str(resp.url), loc)

    @staticmethod
    def _with_digest(url: str, digest: str) -> str:
        return f"{url}{'&' if '?' in url else '?'}digest={digest}"

    def open_blob(self, digest: str) -> Iterator[bytes]:
        """Stream a blob (following the registry's redirect to its storage)."""
        resp = self._send("GET", f"{self.base}blobs/{digest}", stream=True)
        try:
            if resp.status_code == 404:
                raise NotFound(f"{self.location} has no blob {digest[:19]}… although a manifest names it",
                               hint="push the version again from a store that has it")
            if resp.status_code != 200:
                raise self._fail(resp, f"GET blob {digest[:19]}…")
            try:  # chunks as they arrive (not gathered to READ bytes), so a trickle meets the stall floor
                yield from unstalled(resp.iter_bytes(), f"{self.location}: blob {digest[:19]}…", self.floor)
            except httpx2.HTTPError as e:
                raise StoreUnreachable(f"{self.location}: blob {digest[:19]}… cut short ({type(e).__name__})",
                                       hint="pull again; nothing was kept") from None
        finally:
            resp.close()

    def _small_body(self, resp: httpx2.Response, what: str, hint: str) -> bytes:
        """A small document's body (capped, held to the stall floor); a dropped or stalled read is one line."""
        try:
            return read_capped(unstalled(resp.iter_bytes(), what, self.floor), what, hint=hint)
        except httpx2.HTTPError as e:
            raise StoreUnreachable(f"{what}: cut short ({type(e).__name__})", hint="retry") from None

    def get_manifest(self, reference: str) -> FetchedManifest | None:
        """The manifest a tag or digest names (at most MAX_MANIFEST bytes), or None."""
        resp = self._send("GET", f"{self.base}manifests/{reference}", headers={"Accept": ACCEPT}, stream=True)
        try:
            if resp.status_code == 404:
                return None
            if resp.status_code != 200:
                raise self._fail(resp, f"GET manifest {reference}")
            data = self._small_body(resp, f"{self.location}:{reference}: the manifest",
                                    hint="this is not a manifest mreg wrote or can read")
        finally:
            resp.close()
        kind = resp.headers.get("content-type", "").split(";")[0].strip()
        return FetchedManifest(data, kind, "sha256:" + hashlib.sha256(data).hexdigest())

    def put_manifest(self, data: bytes, media_type: str, tag: str) -> None:
        """PUT the manifest under its tag; the registry checks every blob it names is there."""
        resp = self._send("PUT", f"{self.base}manifests/{tag}", body=data, headers={"Content-Type": media_type})
        if resp.status_code != 201:
            raise self._fail(resp, f"manifest {tag}")

    def referrers(self, subject: str) -> list[dict[str, Any]]:
        """The referrers API's list (every page), or, where it answers 404, the referrers tag schema's index."""
        url = f"{self.base}referrers/{subject}"
        out: list[dict[str, Any]] = []
        for page in range(MAX_REFERRER_PAGES):
            resp = self._send("GET", url, headers={"Accept": media.OCI_INDEX}, stream=True)
            try:
                if resp.status_code == 404 and page == 0:  # no referrers API (distribution 2.8): the tag schema
                    got = self.get_manifest(referrers.tag_for(subject))
                    return referrers.entries(got.data if got else None)
                if resp.status_code != 200:
                    raise self._fail(resp, f"GET referrers of {subject[:19]}…")
                data = self._small_body(resp, f"{self.location}: a page of the referrers of {subject[:19]}…",
                                        hint="this is not a list mreg can read")
            finally:
                resp.close()
            out += referrers.entries(data)
            following = resp.links.get("next", {}).get("url")
            if not following:
                break
            url = urljoin(str(resp.url), following)
        return out

    def put_referrer(self, data: bytes, media_type: str, subject: str) -> None:
        """PUT the manifest by digest; unless the registry lists it itself (it answers `OCI-Subject`), add it to
        the tag-schema index (read, append, PUT: the spec has no compare-and-swap for it)."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        resp = self._send("PUT", f"{self.base}manifests/{digest}", body=data, headers={"Content-Type": media_type})
        if resp.status_code != 201:
            raise self._fail(resp, f"referrer {digest[:19]}…")
        if resp.headers.get("oci-subject") == subject:
            return
        tag = referrers.tag_for(subject)
        current = self.get_manifest(tag)
        index = referrers.updated(current.data if current else None, referrers.descriptor(data, media_type),
                                  f"{self.location}:{tag}")
        if index is not None:
            self.put_manifest(index, media.OCI_INDEX, tag)

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def __enter__(self) -> RegistryTarget:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
