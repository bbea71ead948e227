"""Registry credentials as the container ecosystem keeps them, and the two challenges registries send.

Where: `$REGISTRY_AUTH_FILE` (podman, skopeo), else `$DOCKER_CONFIG/config.json`, else
`~/.docker/config.json`. What: `auths[HOST].auth` (base64 `user:password`), `username`/`password`,
`identitytoken`, or a credential helper (`credHelpers[HOST]`, else `credsStore`: the program
`docker-credential-NAME get`). Challenges: `Basic realm=…` (the credentials on every request) and
`Bearer realm=…,service=…,scope=…` (a token from the realm, with the credentials when there are
some, anonymously otherwise). Secrets live in memory only: never printed, logged or written.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from registry.config import DOCKER_CONFIG, REGISTRY_AUTH_FILE
from registry.errors import UsageError
from registry.inputs import read_input


@dataclass(frozen=True)
class Credentials:
    """A username and secret (a password, or an identity token with `<token>` as the user)."""

    username: str
    secret: str = field(repr=False)


def auth_file() -> Path:
    """The file that holds registry credentials (which may not exist)."""
    if named := REGISTRY_AUTH_FILE.value():
        return Path(named)
    if directory := DOCKER_CONFIG.value():
        return Path(directory) / "config.json"
    return Path.home() / ".docker" / "config.json"


def _host_key(key: str) -> str:
    """`https://host:5000/v1/` → `host:5000`; Docker Hub's legacy key names docker.io."""
    key = re.sub(r"^[a-z]+://", "", key).split("/", 1)[0]
    return "docker.io" if key in ("index.docker.io", "registry-1.docker.io") else key


def lookup(host: str, path: Path | None = None) -> Credentials | None:
    """The credentials the auth file (or its helper) has for a registry host, if any."""
    path = path or auth_file()
    hint = "fix or remove it, or point REGISTRY_AUTH_FILE at another file"
    if not os.path.exists(path):  # no auth file (or a dangling link): no credentials
        return None
    try:
        # a regular file of sane size (a few KiB per registry): REGISTRY_AUTH_FILE=/dev/zero would be read forever
        doc = json.loads(read_input(path, "the registry auth file", limit=4 << 20, hint=hint))
    except (OSError, ValueError) as e:
        raise UsageError(f"cannot read the registry auth file {path}: {type(e).__name__}", hint=hint) from None
    if not isinstance(doc, dict):
        raise UsageError(f"the registry auth file {path} is not a JSON object", hint="fix or remove it")
    want = _host_key(host)
    helpers = doc.get("credHelpers") or {}
    helper = next((v for k, v in helpers.items() if _host_key(k) == want), None) or doc.get("credsStore")
    for key, entry in (doc.get("auths") or {}).items():
        if _host_key(key) != want or not isinstance(entry, dict):
            continue
        if entry.get("identitytoken"):
            return Credentials("<token>", str(entry["identitytoken"]))
        if entry.get("auth"):
            try:
                user, _, secret = base64.b64decode(entry["auth"]).decode().partition(":")
            except (ValueError, UnicodeDecodeError):
                raise UsageError(f"the auth entry for {want} in {path} is not base64 of user:password",
                                 hint="log in again (`skopeo login`, `docker login`)") from None
            return Credentials(user, secret)
        if entry.get("username") and entry.get("password"):
            return Credentials(str(entry["username"]), str(entry["password"]))
    return _from_helper(str(helper), host) if helper else None


def _from_helper(helper: str, host: str) -> Credentials | None:
    """Ask `docker-credential-HELPER get` (the protocol: the server on stdin, JSON on stdout)."""
    try:
        done = subprocess.run([f"docker-credential-{helper}", "get"], input=host.encode(), capture_output=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise UsageError(f"the credential helper docker-credential-{helper} could not run ({type(e).__name__})",
                         hint="install it, or remove credsStore/credHelpers from the auth file") from None
    if done.returncode != 0:
        return None  # "credentials not found in native keychain"
    try:
        doc = json.loads(done.stdout)
        return Credentials(str(doc["Username"]), str(doc["Secret"]))
    except (ValueError, KeyError, TypeError):
        return None


@dataclass(frozen=True)
class Challenge:
    """A parsed `WWW-Authenticate` header."""

    scheme: str
    params: dict[str, str]


def parse_challenge(header: str) -> Challenge | None:
    """`Bearer realm="…",service="…",scope="…"` → its scheme and parameters (None when unparseable)."""
    m = re.match(r"\s*([A-Za-z]+)\s*(.*)$", header)
    if not m:
        return None
    params = {k.lower(): v for k, v in re.findall(r'([A-Za-z]+)\s*=\s*"([^"]*)"', m.group(2))}
    return Challenge(m.group(1).lower(), params)


def basic_header(creds: Credentials) -> str:
    """The `Authorization` value of HTTP basic authentication."""
    return "Basic " + base64.b64encode(f"{creds.username}:{creds.secret}".encode()).decode()
