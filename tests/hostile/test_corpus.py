"""The hostile-input corpus (issue 15): one table of damaged, odd and malicious inputs, every case held to the same
promise (support.corpus). Sibling modules hold the later passes' tables.

Each case builds its input in a fresh world (conftest.World) and returns the command line to run; the cheapest
path that reaches the check is used: a local directory for sources, `--to hf` (or `--to gguf:F16`, which
fails in its plan before any tensor is encoded), a version published --to hf for the store's readers.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.cli import run
from support.corpus import Case, Setup, check_case
from support.hostile import SAFETENSORS_DAMAGE, link_out
from support.tiny_models import set_value
from support.world import BUCKET, World

from registry import layout


def _convert(target: str) -> Setup:
    return lambda w: ["convert", w.src, "--to", target, "--name", "m"]


def _damaged_weights(how: str, target: str) -> Setup:
    def setup(w: World) -> Sequence[str | Path]:
        path = w.src / "model.safetensors"
        path.write_bytes(SAFETENSORS_DAMAGE[how](path.read_bytes()))
        return _convert(target)(w)
    return setup


def _file(rel: str, content: bytes, target: str) -> Setup:
    def setup(w: World) -> Sequence[str | Path]:
        (w.src / rel).write_bytes(content)
        return _convert(target)(w)
    return setup


def _config(target: str = "gguf:F16", **changes: Any) -> Setup:
    def setup(w: World) -> Sequence[str | Path]:
        config = json.loads((w.src / "config.json").read_text())
        (w.src / "config.json").write_text(json.dumps({**config, **changes}))
        return _convert(target)(w)
    return setup


def _nan_weight(w: World) -> Sequence[str | Path]:
    set_value(w.src, "model.layers.1.mlp.up_proj.weight", 7, float("nan"))
    return _convert("hf")(w)


def _pull_with(make: Callable[[World, Path], None]) -> Setup:
    def setup(w: World) -> Sequence[str | Path]:
        make(w, w.src)
        return ["pull", w.src]
    return setup


def _non_utf8_name(w: World, src: Path) -> None:
    with open(os.fsencode(src) + b"/extra-\xff\xfe.json", "wb") as f:
        f.write(b"{}")


def _read_only_store(w: World) -> Sequence[str | Path]:
    w.publish()
    for dirpath, _dirs, _names in os.walk(w.store):
        os.chmod(dirpath, 0o555)
    (w.src / "config.json").write_text('{"model_type": "llama", "changed": true}')
    return ["convert", w.src, "--to", "hf", "--name", "m"]


def _history(damage: str, *command: str) -> Setup:
    """Two versions, production promoted to 1 then 2, then history.jsonl replaced by binary bytes or a directory."""
    def setup(w: World) -> Sequence[str | Path]:
        w.publish(2)
        for v in (1, 2):
            assert run("promote", f"m@{v}").exit_code == 0
        log = layout.model_dir(w.store, "m") / layout.HISTORY
        log.unlink()
        if damage == "binary":
            log.write_bytes(b"\xff\xfe\x00garbage" * 10)
        else:
            log.mkdir()
        return command
    return setup


def _version_linked_out(*command: str, rel: str = "models/m/versions/1") -> Setup:
    """A version (or part of it) moved outside the store and a symlink left in its place."""
    def setup(w: World) -> Sequence[str | Path]:
        w.publish()
        assert run("promote", "m@1").exit_code == 0
        link_out(w.store, rel, w.outside / "moved")
        return command
    return setup


def _alias_out(*command: str) -> Setup:
    def setup(w: World) -> Sequence[str | Path]:
        w.publish()
        alias = layout.alias_path(w.store, "m", "production")
        alias.symlink_to(w.outside / "model")
        return command
    return setup


def _manifest(content: bytes, *command: str) -> Setup:
    def setup(w: World) -> Sequence[str | Path]:
        w.publish()
        path = layout.version_dir(w.store, "m", 1) / layout.MANIFEST
        os.chmod(path.parent, 0o755)
        path.unlink()
        path.write_bytes(content)
        return command
    return setup


def _carried_blob_missing(w: World) -> Sequence[str | Path]:
    """Version 1's weights gone from its tree and from the blobs: converting from m@1 carries what is not there."""
    w.publish()
    vdir = layout.version_dir(w.store, "m", 1)
    manifest = json.loads((vdir / layout.MANIFEST).read_text())
    (entry,) = [f for f in manifest["artifacts"][0]["files"] if f["path"] == "model.safetensors"]
    layout.blob_path(w.store, entry["sha256"]).unlink()
    (vdir / "hf" / "model.safetensors").unlink()
    return ["convert", "m@1", "--to", "gguf:F16"]


def _store_is_a_file(*command: str) -> Setup:
    def setup(w: World) -> Sequence[str | Path]:
        w.store.write_text("not a store")
        return command
    return setup


def _hub_listing_clash(w: World) -> Sequence[str | Path]:
    assert w.hub is not None
    w.hub.add_commit("org/clash", {"config.json": b"{}", "config.json/x": b"{}", "model.safetensors": b"x"})
    return ["pull", "org/clash", "--endpoint", w.hub.endpoint]


# -- S3: what someone with write access to the bucket can put there ---------------------------------------------


def _remote_alias(content: bytes, *command: str) -> Setup:
    def setup(w: World) -> Sequence[str | Path]:
        w.pushed()
        w.put(w.key(*layout.s3_alias("m", "production")), content)
        if command[0] == "sync":
            w.forget_local()
        return [c.replace("REMOTE", w.remote) for c in command]
    return setup


def _remote_manifest(change: dict[str, Any] | bytes) -> Setup:
    """The remote manifest rewritten, and its alias record made to match the new bytes: only the key it was
    read from can give it away."""
    def setup(w: World) -> Sequence[str | Path]:
        import hashlib

        w.pushed()
        key = w.key(*layout.s3_manifest("m", 1))
        data = change if isinstance(change, bytes) else json.dumps({**json.loads(w.object(key)), **change}).encode()
        w.put(key, data)
        alias = w.key(*layout.s3_alias("m", "production"))
        record = json.loads(w.object(alias))
        w.put(alias, json.dumps({**record, "manifest_sha256": hashlib.sha256(data).hexdigest()}).encode())
        w.forget_local()  # the local store is a serving node that has nothing yet
        return ["sync", w.remote, "m"]
    return setup


def _remote_blob_missing(w: World) -> Sequence[str | Path]:
    w.pushed()
    manifest = json.loads(w.object(w.key(*layout.s3_manifest("m", 1))))
    digest = next(f["sha256"] for f in manifest["artifacts"][0]["files"] if f["path"] == "model.safetensors")
    assert w.s3 is not None
    w.s3.client().delete_object(Bucket=BUCKET, Key=w.key(*layout.s3_blob(digest)))
    w.forget_local()
    return ["sync", w.remote, "m"]


def _remote_index(content: bytes) -> Setup:
    """The key index (conversion key -> version) garbage: a re-push reads it to find the version."""
    def setup(w: World) -> Sequence[str | Path]:
        w.pushed()
        manifest = json.loads((layout.version_dir(w.store, "m", 1) / layout.MANIFEST).read_text())
        w.put(w.key(*layout.s3_key_index("m", manifest["key"])), content)
        return ["push", "m@1", w.remote]
    return setup


def _remote_lease(content: bytes) -> Setup:
    """A lease (the blobs an in-flight push protects from gc) that mreg did not write: gc cannot know what to keep."""
    def setup(w: World) -> Sequence[str | Path]:
        w.pushed()
        w.put(w.key(*layout.s3_lease("0" * 32)), content)
        return ["gc", "--store", w.remote, "--yes", "--grace-hours", "0"]
    return setup


HUB_NAMES = ["dir/", "a//b", "a" * 300, "org/" + "b" * 97, "ab--c/d", "org/name-"]


def _nothing_cached(w: World, error: dict[str, Any]) -> None:
    """Refused before any request: nothing in the cache, and a message short enough to read."""
    assert not w.cache.exists() or not any(w.cache.rglob("*"))
    assert len(error["message"]) < 200, error["message"]

CASES: list[Case] = [
    # safetensors headers, through the identity converter and through GGUF's plan
    *(Case(f"safetensors {how} --to {t}", _damaged_weights(how, t), 4, "InvalidSafetensors",
           ("model.safetensors is not a valid safetensors file",))
      for how in SAFETENSORS_DAMAGE for t in ("hf", "gguf:F16")),
    Case("NaN weight --to hf", _nan_weight, 4, "IntegrityError", ("model.layers.1.mlp.up_proj.weight", "NaN/Inf")),
    # configs and tokenizers
    *(Case(f"{rel} {what} --to {t}", _file(rel, content, t), 4, None, (rel,))
      for rel in ("config.json", "tokenizer.json", "tokenizer_config.json")
      for what, content in (("not JSON", b'{"vocab_size": 3'), ("not UTF-8", b"\xff\xfe{}"),
                            ("a JSON array", b"[1, 2, 3]"), ("nested 100000 deep", b"[" * 100_000))
      for t in ("hf", "gguf:F16")),
    *(Case(f"config.json {key}={value!r} --to gguf", _config(**{key: value}), 4, "InconsistentModel", (says,))
      for key, value, says in [
          ("vocab_size", 10**12, "is not a size"),
          ("num_hidden_layers", 10**9, "num_hidden_layers is 1000000000 but the weights hold layers 0..1"),
          ("hidden_size", 10**9, "config.json says"),
          ("intermediate_size", -5, "is not a size"),
          ("hidden_size", "abc", "is not a size"),
          ("num_attention_heads", True, "is not a size"),
          ("num_key_value_heads", 3, "over 3 KV heads"),
      ]),
    # local directories
    Case("a self-loop symlink", _pull_with(lambda w, s: (s / "loop").symlink_to("loop")), 8, "UnsafeInput",
         ("loop",)),
    Case("a file symlink out", _pull_with(lambda w, s: (s / "evil").symlink_to("/etc/passwd")), 8, "UnsafeInput",
         ("evil",)),
    Case("a directory symlink out", _pull_with(lambda w, s: (s / "extra").symlink_to(w.outside)), 8, "UnsafeInput",
         ("extra",)),
    Case("a link named with a newline", _pull_with(lambda w, s: (s / "x\nerror: forged").symlink_to("/etc")), 8,
         "UnsafeInput"),
    Case("a non-UTF-8 file name", _pull_with(_non_utf8_name), 8, "UnsafeInput"),
    Case("a FIFO among the files", _pull_with(lambda w, s: os.mkfifo(s / "pipe")), 8, "UnsafeInput", ("pipe",)),
    Case("pickle weights only", _pull_with(lambda w, s: (
        (s / "model.safetensors").unlink(), (s / "pytorch_model.bin").write_bytes(b"\x80\x04pickle"))), 8,
         "UnsafeInput"),
    Case("a source that is a file", lambda w: ["pull", w.src / "config.json"], 3, "NotFound", ("not a directory",)),
    # the store
    Case("read-only store", _read_only_store, 1, "PermissionDenied", ("permission denied",), unprivileged=True),
    Case("store path is a file: list", _store_is_a_file("list"), 2),
    Case("store path is a file: convert", _store_is_a_file("convert", "SRC", "--to", "hf", "--name", "m"), 2),
    *(Case(f"history.jsonl {damage}: {' '.join(cmd)}", _history(damage, *cmd), 4, "IntegrityError", ("history",))
      for damage in ("binary", "directory") for cmd in (("history", "m"), ("rollback", "m"), ("gc", "--yes"))),
    *(Case(f"version dir symlinked out: {' '.join(cmd)}", _version_linked_out(*cmd), 4, "IntegrityError",
           ("m@1",) if cmd[0] == "verify" else ("symlink",))  # verify names the version; its report, the link
      for cmd in (("gc", "--yes", "--keep-latest", "0", "--keep-history", "0"), ("verify", "m@1"),
                  ("mount-check", "m", "--verify"), ("show", "m@1"), ("resolve", "m@production"))),
    Case("artifact file symlinked out: verify", _version_linked_out(
        "verify", "m@1", rel="models/m/versions/1/hf/config.json"), 4, "IntegrityError", ("m@1",)),
    *(Case(f"alias symlinked out of the store: {' '.join(cmd)}", _alias_out(*cmd), 4, "IntegrityError",
           ("production",))
      for cmd in (("resolve", "m@production"), ("mount-check", "m"), ("list", "m"), ("promote", "m@1"),
                  ("gc", "--yes"))),
    Case("manifest not JSON: show", _manifest(b"\x00\xffgarbage", "show", "m@1"), 4, "IntegrityError"),
    Case("manifest not JSON: verify", _manifest(b"\x00\xffgarbage", "verify", "m@1"), 4, "IntegrityError"),
    Case("manifest of the wrong schema: show", _manifest(b'{"schema_version": 1}', "show", "m@1"), 4,
         "IntegrityError"),
    Case("missing carried blob: convert m@1", _carried_blob_missing, 4, "IntegrityError"),
    Case("a model name that climbs out", lambda w: ["convert", w.src, "--to", "hf", "--name", "../escape"], 2,
         "UsageError", ("bad model name",)),
    Case("a reference that climbs out", lambda w: ["show", "../../etc@1"], 2, "UsageError", ("bad model name",)),
    Case("a missing model's history", lambda w: ["history", "nope"], 3, "ModelNotFound"),
    # hub ids: refused before any request (the endpoint is a closed port)
    *(Case(f"hub id {name[:40]!r}", lambda w, n=name: ["pull", n, "--endpoint", "http://127.0.0.1:9"], 8,
           "UnsafeInput", check=_nothing_cached) for name in HUB_NAMES),
    Case("hub listing with config.json and config.json/x", _hub_listing_clash, 8, "UnsafeInput", ("config.json",),
         needs="hub"),
    # S3
    Case("S3 alias garbage: sync", _remote_alias(b"\x00\xff garbage", "sync", "REMOTE", "m"), 4, "IntegrityError",
         needs="s3"),
    Case("S3 alias garbage: promote", _remote_alias(b"\x00\xff garbage", "promote", "m@1", "--store", "REMOTE"), 4,
         "IntegrityError", needs="s3"),
    Case("S3 alias of the wrong schema: sync", _remote_alias(b'{"schema_version": 1, "to": "x"}', "sync", "REMOTE",
                                                            "m"), 4, "IntegrityError", needs="s3"),
    Case("S3 alias a JSON array: list", _remote_alias(b"[]", "list", "m", "--store", "REMOTE"), 4, "IntegrityError",
         needs="s3"),
    Case("S3 manifest version disagrees with its key", _remote_manifest({"version": 2}), 4, "IntegrityError",
         needs="s3"),
    Case("S3 manifest name disagrees with its key", _remote_manifest({"name": "other"}), 4, "IntegrityError",
         needs="s3"),
    Case("S3 manifest garbage", _remote_manifest(b"\x00garbage"), 4, "IntegrityError", needs="s3"),
    Case("S3 blob missing: sync", _remote_blob_missing, 4, "IntegrityError", needs="s3"),
    Case("S3 key index garbage: push", _remote_index(b"\x00garbage"), 4, "IntegrityError", ("key index",),
         needs="s3"),
    Case("S3 lease garbage: gc", _remote_lease(b"\x00garbage"), 4, "IntegrityError", ("lease",), needs="s3"),
    Case("S3 lease of the wrong schema: gc", _remote_lease(b'{"at": 1e18, "digests": 7}'), 4, "IntegrityError",
         ("lease",), needs="s3"),
    Case("S3 key index of the wrong schema: push", _remote_index(b'{"version": "1"}'), 4, "IntegrityError",
         ("key index",), needs="s3"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_gets_one_line_and_changes_nothing(case: Case, request: pytest.FixtureRequest) -> None:
    check_case(case, request)
