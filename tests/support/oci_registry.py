"""A real OCI registry on loopback for tests: the CNCF distribution registry (Debian's `docker-registry`).

`docker-registry serve CONFIG` with `http.addr: 127.0.0.1:PORT` and filesystem storage in a
temporary directory; with `users`, htpasswd (bcrypt) authentication, so every request must carry
basic credentials; with `token_auth`, bearer tokens from a token server (`support.token_server`).
Without the binary the tests skip, naming the install command; with MREG_REQUIRE_OCI=1 (CI) they
fail instead.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

INSTALL = "apt-get install -y docker-registry skopeo"
REQUIRE_ENV = "MREG_REQUIRE_OCI"


class Unavailable(RuntimeError):
    """The registry or skopeo binary is missing."""


def binaries() -> tuple[str, str]:
    """The `docker-registry` and `skopeo` executables, or Unavailable naming the install command."""
    reg, skopeo = shutil.which("docker-registry"), shutil.which("skopeo")
    if not reg or not skopeo:
        raise Unavailable(f"docker-registry and skopeo are needed for the OCI tests: {INSTALL}")
    return reg, skopeo


def need_binaries() -> None:
    """Skip the calling test without the registry and skopeo, naming the install command; fail in CI instead."""
    import pytest

    try:
        binaries()
    except Unavailable as e:
        if os.environ.get(REQUIRE_ENV):
            pytest.fail(str(e))
        pytest.skip(str(e))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalRegistry:
    """Start and stop `docker-registry serve` on 127.0.0.1 (plain HTTP), optionally with htpasswd users."""

    def __init__(self, root: Path, users: dict[str, str] | None = None, *,
                 token_auth: list[str] | None = None) -> None:
        self.root = root
        self.users = users or {}
        self.token_auth = token_auth  # an `auth: token:` section (support.token_server.TokenServer.registry_auth)
        self.host = ""
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def storage(self) -> Path:
        """Where the registry keeps blobs and repositories (`docker/registry/v2/…`)."""
        return self.root / "data"

    def blob_file(self, digest: str) -> Path:
        """The file holding a blob's bytes on the registry's disk."""
        hexdigest = digest.split(":", 1)[1]
        return self.storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"

    def start(self, timeout: float = 20) -> str:
        """Start the registry and wait until /v2/ answers; returns HOST:PORT."""
        reg, _ = binaries()
        self.root.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        self.host = f"127.0.0.1:{port}"
        config = [
            "version: 0.1", "log:", "  level: error", "  accesslog:", "    disabled: true",
            "storage:", f"  filesystem:\n    rootdirectory: {self.storage}", "  delete:\n    enabled: true",
            "http:", f"  addr: {self.host}",
        ]
        if self.token_auth:
            config += self.token_auth
        elif self.users:
            import bcrypt

            salt = bcrypt.gensalt(rounds=4)  # the fastest cost: these are test passwords
            lines = [f"{u}:{bcrypt.hashpw(p.encode(), salt).decode()}" for u, p in self.users.items()]
            (self.root / "htpasswd").write_text("\n".join(lines) + "\n")
            config += ["auth:", "  htpasswd:", "    realm: mreg-test", f"    path: {self.root / 'htpasswd'}"]
        (self.root / "config.yml").write_text("\n".join(config) + "\n")
        log = open(self.root / "registry.log", "wb")  # noqa: SIM115 - lives as long as the server
        env = {k: v for k, v in os.environ.items() if not k.startswith("REGISTRY_")}
        self.proc = subprocess.Popen([reg, "serve", str(self.root / "config.yml")], stdout=log,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"docker-registry exited {self.proc.returncode}: see {self.root / 'registry.log'}")
            try:
                urllib.request.urlopen(f"http://{self.host}/v2/", timeout=1)
                return self.host
            except urllib.error.HTTPError:  # 401: up, and asking for credentials
                return self.host
            except OSError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        """Stop the registry."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        self.proc = None

    def __enter__(self) -> LocalRegistry:
        self.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()


def killed_push(store: Path, version: str, target: str, *, after: int, chunk: int | None = None,
                insecure: bool = True) -> None:
    """`api.push` in a child process, SIGKILLed by its own progress once it has heard of `after` bytes (right
    after a blob or a chunk was accepted): what a push killed mid-way leaves behind."""
    import subprocess
    import sys

    script = (
        "import os, signal, sys\n"
        "from registry import api\n"
        "class Killer:\n"
        "    seen = 0\n"
        "    def start(self, *a, **k): pass\n"
        "    def done(self): pass\n"
        "    def advance(self, n):\n"
        "        Killer.seen += n\n"
        f"        if Killer.seen > {after}: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"api.push(api.open_local_store(sys.argv[1]), {version!r}, sys.argv[2], insecure={insecure}, "
        f"progress=Killer(), chunk={chunk})\n"
    )
    repo_root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo_root), os.environ.get("PYTHONPATH", "")])}
    killed = subprocess.run([sys.executable, "-c", script, str(store), target], env=env, timeout=60, check=False)
    assert killed.returncode == -9, f"the push was not killed mid-way (exit {killed.returncode})"
