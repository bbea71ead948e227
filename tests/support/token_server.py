"""A small Docker token server on loopback, for the distribution registry's `auth: token:` mode.

The flow it serves (Docker's token authentication, which distribution 2.8 checks in
`registry/auth/token`): the registry answers 401 with `Bearer realm="http://127.0.0.1:P/token",
service="…",scope="repository:REPO:pull"`; the client GETs the realm with `service` and `scope` and
its basic credentials; this server checks them and returns `{"token": JWT}`; the registry accepts the
JWT when its `iss` is the configured issuer, its `aud` the service, `exp`/`nbf` hold, its `access`
claim grants the actions, and its ES256 signature verifies with the key of the `x5c` certificate in
the header, which must chain to the registry's `rootcertbundle` (here: that one self-signed
certificate). Wrong credentials are 401, and so is a request without any (the registry is private).
The OAuth2 form is served too (`POST` with `grant_type=refresh_token`, `client_id`, `refresh_token`:
what an `identitytoken` in an auth file is exchanged by), for the tokens in `refresh_tokens`.

`requests` records every token request (user, service, scope; never the password) for the tests.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, urlparse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

SERVICE = "mreg-test-registry"
ISSUER = "mreg-test-token-issuer"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenServer:
    """Issue ES256 JWTs for users with the right password; `rootcertbundle` is the certificate to trust."""

    def __init__(self, root: Path, users: dict[str, str], *, lifetime_s: int = 300) -> None:
        self.root, self.users, self.lifetime_s = root, users, lifetime_s
        self.requests: list[dict[str, str]] = []
        self.refresh_tokens: dict[str, str] = {}  # refresh token → user
        self.key = ec.generate_private_key(ec.SECP256R1())
        now = dt.datetime.now(dt.timezone.utc)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(x509.random_serial_number())
                     .not_valid_before(now - dt.timedelta(days=1)).not_valid_after(now + dt.timedelta(days=30))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                     .sign(self.key, hashes.SHA256()))
        root.mkdir(parents=True, exist_ok=True)
        self.rootcertbundle = root / "token-root.pem"
        self.rootcertbundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self._server: ThreadingHTTPServer | None = None
        self.realm = ""

    def token(self, user: str, service: str, scopes: list[str]) -> str:
        """A JWT granting `user` every action asked for in `scopes` (`repository:NAME:pull,push`)."""
        access: list[dict[str, Any]] = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            access.append({"type": kind, "name": name, "actions": [a for a in actions.split(",") if a]})
        now = int(time.time())
        header = {"alg": "ES256", "typ": "JWT",
                  "x5c": [base64.b64encode(self.cert.public_bytes(serialization.Encoding.DER)).decode()]}
        claims = {"iss": ISSUER, "sub": user, "aud": service, "exp": now + self.lifetime_s, "nbf": now - 5,
                  "iat": now, "jti": uuid.uuid4().hex, "access": access}
        signing_input = f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
        return f"{signing_input}.{_b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _reply(self, status: int, doc: dict[str, Any]) -> None:
                body = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                if status == 401:
                    self.send_header("WWW-Authenticate", 'Basic realm="mreg-test-token"')
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                url = urlparse(self.path)
                if url.path != "/token":
                    self._reply(404, {"errors": [{"code": "NOT_FOUND"}]})
                    return
                q = parse_qs(url.query)
                user = password = ""
                got = self.headers.get("Authorization", "")
                if got.startswith("Basic "):
                    try:
                        user, _, password = base64.b64decode(got[6:]).decode().partition(":")
                    except ValueError:
                        user = password = ""
                service = q.get("service", [""])[0]
                scopes = q.get("scope", [])
                server.requests.append({"user": user, "service": service, "scope": " ".join(scopes)})
                if not user or server.users.get(user) != password:
                    self._reply(401, {"errors": [{"code": "UNAUTHORIZED", "message": "bad credentials"}]})
                    return
                token = server.token(user, service, scopes)
                self._reply(200, {"token": token, "access_token": token, "expires_in": server.lifetime_s,
                                  "issued_at": dt.datetime.now(dt.timezone.utc).isoformat()})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                form = parse_qs(self.rfile.read(length).decode())
                one = {k: v[0] for k, v in form.items()}
                user = server.refresh_tokens.get(one.get("refresh_token", ""), "")
                server.requests.append({"user": user, "service": one.get("service", ""),
                                        "scope": " ".join(form.get("scope", [])), "grant": one.get("grant_type", "")})
                if urlparse(self.path).path != "/token" or one.get("grant_type") != "refresh_token" \
                        or not one.get("client_id"):
                    self._reply(400, {"error": "unsupported_grant_type"})
                    return
                if not user:
                    self._reply(401, {"error": "invalid_grant"})
                    return
                token = server.token(user, one.get("service", ""), form.get("scope", []))
                self._reply(200, {"access_token": token, "expires_in": server.lifetime_s})

        return Handler

    def start(self) -> str:
        """Serve on 127.0.0.1 in a thread; returns the realm URL."""
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.realm = f"http://127.0.0.1:{self._server.server_address[1]}/token"
        return self.realm

    def stop(self) -> None:
        """Stop serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def registry_auth(self) -> list[str]:
        """The `auth:` section of a distribution config that trusts this server."""
        return ["auth:", "  token:", f"    realm: {self.realm}", f"    service: {SERVICE}", f"    issuer: {ISSUER}",
                f"    rootcertbundle: {self.rootcertbundle}"]

    def __enter__(self) -> TokenServer:
        self.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
