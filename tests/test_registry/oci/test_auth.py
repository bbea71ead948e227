"""Registry authentication against the real distribution registry: bearer tokens from a token server, and a
Docker credential helper named by `credHelpers` in `REGISTRY_AUTH_FILE`."""

from __future__ import annotations

import base64
import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok
from support.oci_registry import LocalRegistry, need_binaries
from support.tiny_models import write_random_safetensors

SECRET = "s3cret-do-not-print"


@pytest.fixture(autouse=True)
def _need_binaries() -> None:
    need_binaries()


def _published(mreg: Any, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "config.json").write_text(json.dumps({"model_type": "llama"}))
    write_random_safetensors(src / "model.safetensors", 1 << 16, 1)
    ok(mreg("convert", src, "--to", "hf", "--name", "m", "--json"))


def _auth_file(path: Path, doc: dict[str, Any]) -> Path:
    path.write_text(json.dumps(doc))
    return path


def _basic(host: str, user: str, password: str) -> dict[str, Any]:
    return {"auths": {host: {"auth": base64.b64encode(f"{user}:{password}".encode()).decode()}}}


def _one_line_refusal(r: Any, secret: str) -> dict[str, Any]:
    assert r.exit_code == 13, r.stdout
    err: dict[str, Any] = r.json["error"]
    assert err["type"] == "CredentialsRefused" and "\n" not in err["message"] and err["hint"]
    assert secret not in r.stdout + r.stderr
    return err


def test_bearer_token_auth_push_pull_and_wrong_credentials(mreg: Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cryptography", reason="the token server signs its JWTs with cryptography")
    from support.token_server import SERVICE, TokenServer

    _published(mreg, tmp_path)
    with TokenServer(tmp_path / "tokens", {"alice": SECRET}) as tokens, \
            LocalRegistry(tmp_path / "tokenreg", token_auth=tokens.registry_auth()) as reg:
        target = f"oci://{reg.host}/private/m:v1"
        none = mreg("push", "m@1", target, "--insecure", "--json")
        assert "none were found" in _one_line_refusal(none, SECRET)["message"]

        monkeypatch.setenv("REGISTRY_AUTH_FILE", str(_auth_file(tmp_path / "wrong.json",
                                                                _basic(reg.host, "alice", "wrong-" + SECRET))))
        wrong = mreg("push", "m@1", target, "--insecure", "--json")
        assert "token service" in _one_line_refusal(wrong, "wrong-" + SECRET)["message"]

        monkeypatch.setenv("REGISTRY_AUTH_FILE", str(_auth_file(tmp_path / "right.json",
                                                                _basic(reg.host, "alice", SECRET))))
        tokens.requests.clear()
        pushed = ok(mreg("push", "m@1", target, "--insecure", "--json"))
        assert pushed["uploaded_blobs"] == 4 and SECRET not in json.dumps(pushed)
        assert tokens.requests == [{"user": "alice", "service": SERVICE, "scope": "repository:private/m:pull,push"}]
        assert ok(mreg("push", "m@1", target, "--insecure", "--json"))["reused"]
        cache2 = tmp_path / "cache2"
        pulled = ok(mreg("pull", target, "--insecure", "--cache-dir", cache2, "--json"))
        assert pulled["files"] == 2 and pulled["commit"] == pushed["digest"].split(":")[1]
        assert SECRET not in "".join(p.read_text(errors="replace") for p in cache2.rglob("*.json"))


def test_credentials_are_not_sent_to_a_plain_http_realm_off_this_machine(mreg: Any, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cryptography", reason="the token server signs its JWTs with cryptography")
    from support.token_server import TokenServer

    _published(mreg, tmp_path)
    tokens = TokenServer(tmp_path / "tokens", {"alice": SECRET})
    tokens.realm = "http://192.0.2.1/token"  # TEST-NET-1: never reached, and never to be sent a password
    with LocalRegistry(tmp_path / "tokenreg", token_auth=tokens.registry_auth()) as reg:
        monkeypatch.setenv("REGISTRY_AUTH_FILE", str(_auth_file(tmp_path / "a.json", _basic(reg.host, "alice",
                                                                                             SECRET))))
        r = mreg("push", "m@1", f"oci://{reg.host}/private/m:v1", "--insecure", "--json")
        assert "not HTTPS" in _one_line_refusal(r, SECRET)["message"]


def test_an_identity_token_is_exchanged_at_the_token_service(mreg: Any, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`auths[HOST].identitytoken` (what `docker login` keeps for ACR and others): the OAuth2 refresh-token form."""
    pytest.importorskip("cryptography", reason="the token server signs its JWTs with cryptography")
    from support.token_server import TokenServer

    _published(mreg, tmp_path)
    with TokenServer(tmp_path / "tokens", {}) as tokens, \
            LocalRegistry(tmp_path / "tokenreg", token_auth=tokens.registry_auth()) as reg:
        tokens.refresh_tokens["rt-" + SECRET] = "carol"
        target = f"oci://{reg.host}/private/m:v1"
        monkeypatch.setenv("REGISTRY_AUTH_FILE", str(_auth_file(
            tmp_path / "wrong.json", {"auths": {reg.host: {"identitytoken": "rt-stale-" + SECRET}}})))
        _one_line_refusal(mreg("push", "m@1", target, "--insecure", "--json"), SECRET)
        monkeypatch.setenv("REGISTRY_AUTH_FILE", str(_auth_file(
            tmp_path / "right.json", {"auths": {reg.host: {"identitytoken": "rt-" + SECRET}}})))
        assert ok(mreg("push", "m@1", target, "--insecure", "--json"))["uploaded_blobs"] == 4
        assert ok(mreg("pull", target, "--insecure", "--cache-dir", tmp_path / "c2", "--json"))["files"] == 2
        assert {r["user"] for r in tokens.requests} == {"", "carol"}
        assert {r.get("grant") for r in tokens.requests} == {"refresh_token"}


def _helper(bin_dir: Path, name: str, host: str, user: str, password: str, log: Path) -> None:
    """`docker-credential-NAME get`: the server on stdin, `{"Username", "Secret"}` on stdout (the protocol)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / f"docker-credential-{name}"
    script.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        "server = sys.stdin.read().strip()\n"
        f"open({str(log)!r}, 'a').write(sys.argv[1] + ' ' + server + '\\n')\n"
        f"if sys.argv[1] != 'get' or server != {host!r}:\n"
        "    print('credentials not found in native keychain'); sys.exit(1)\n"
        f"print(json.dumps({{'ServerURL': server, 'Username': {user!r}, 'Secret': {password!r}}}))\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


def test_credential_helper_named_by_cred_helpers(mreg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("bcrypt", reason="bcrypt makes the registry's htpasswd file: pip install bcrypt")
    _published(mreg, tmp_path)
    with LocalRegistry(tmp_path / "authreg", users={"bob": SECRET}) as reg:
        target = f"oci://{reg.host}/private/m:v1"
        bin_dir, log = tmp_path / "bin", tmp_path / "helper.log"
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("REGISTRY_AUTH_FILE", str(_auth_file(
            tmp_path / "auth.json", {"auths": {}, "credHelpers": {reg.host: "mregtest"}})))

        _helper(bin_dir, "mregtest", reg.host, "bob", "not-" + SECRET, log)
        wrong = mreg("push", "m@1", target, "--insecure", "--json")
        assert "refused the credentials" in _one_line_refusal(wrong, "not-" + SECRET)["message"]

        _helper(bin_dir, "mregtest", reg.host, "bob", SECRET, log)
        assert ok(mreg("push", "m@1", target, "--insecure", "--json"))["uploaded_blobs"] == 4
        assert ok(mreg("pull", target, "--insecure", "--json"))["files"] == 2
        assert set(log.read_text().splitlines()) == {f"get {reg.host}"}

        missing = tmp_path / "missing.json"
        monkeypatch.setenv("REGISTRY_AUTH_FILE", str(_auth_file(missing, {"credHelpers": {reg.host: "absent"}})))
        r = mreg("push", "m@1", target, "--insecure", "--json")
        assert r.exit_code == 2 and "docker-credential-absent" in r.json["error"]["message"]
