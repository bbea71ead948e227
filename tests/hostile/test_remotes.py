"""Hostile remotes (issue 34, items 4 and 5): an OCI registry that streams past a layer's declared size, stops short
of it or trickles, an S3 endpoint whose listing never ends, and (the image-copy item) an `--as-image` image served
without its layer annotations, as a copy by another tool is, but damaged. Each is a small server on 127.0.0.1
(support.lying_servers) in front of real bytes: a version mreg published and pushed to an OCI image layout. The
bounds are set small through their environment variables, so a stall is seen in about a second."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.cli import run
from support.corpus import Case, Setup, check_case
from support.lying_servers import EndlessListing, Lie, LyingRegistry, past_the_end, trickle
from support.world import World

from registry import incoming
from registry.oci import media

TAG = "1"


def _pushed_layout(w: World) -> tuple[Path, str, int]:
    """m@1 published and pushed to an image layout beside the store; its weights layer's digest and size."""
    w.publish()
    layout = w.root / "layout"
    r = run("push", "m@1", f"oci-layout:{layout}:{TAG}", "--json")
    assert r.exit_code == 0, r.stderr
    index = json.loads((layout / "index.json").read_text())
    manifest = json.loads((layout / "blobs" / index["manifests"][0]["digest"].replace(":", "/")).read_text())
    weights = next(d for d in manifest["layers"] if d.get("annotations", {}).get(
        "org.opencontainers.image.title", "").endswith(".safetensors"))
    return layout, weights["digest"], weights["size"]


def _serve(w: World, server: Any) -> str:
    w.notes.setdefault("servers", []).append(server.__enter__())
    return str(server.host)


def _lying(command: str, lie: Lie, *, grow: int = 0, stall: bool = False) -> Setup:
    """`pull` or `sync` from a registry that lies about the weights layer (`grow`: its descriptor says that many
    bytes more than it has); `sync` into a store that no longer has the version."""
    def setup(w: World) -> Sequence[str | Path]:
        layout, victim, size = _pushed_layout(w)
        if command == "sync":
            w.forget_local()
        if stall:
            os.environ[incoming.STALL_SECONDS_ENV], os.environ[incoming.STALL_BYTES_ENV] = "1", "4096"
        host = _serve(w, LyingRegistry(layout, TAG, victim, lie, sizes={victim: size + grow} if grow else None))
        return [command, f"oci://{host}/t/m:{TAG}", "--insecure"]
    return setup


def _copied_image(damage: Callable[[Path, dict[str, Any]], None]) -> Setup:
    """`pull` of m@1's image (`--as-image`) as a copy by another tool serves it (no layer annotations), damaged."""
    def setup(w: World) -> Sequence[str | Path]:
        w.publish()
        layout = w.root / "layout"
        r = run("push", "m@1", f"oci-layout:{layout}:{TAG}", "--as-image", "--json")
        assert r.exit_code == 0, r.stderr

        def rewrite(manifest: dict[str, Any]) -> None:
            for d in manifest["layers"]:
                d.pop("annotations", None)
            damage(layout, manifest)
        return ["pull", f"oci://{_serve(w, LyingRegistry(layout, TAG, rewrite=rewrite))}/t/m:{TAG}", "--insecure"]
    return setup


def _swapped(_layout: Path, manifest: dict[str, Any]) -> None:
    layers = manifest["layers"]
    layers[0], layers[1] = layers[1], layers[0]


def _other_manifest_label(layout: Path, manifest: dict[str, Any]) -> None:
    """The config relabelled to name another mreg manifest (a consistent config blob: its digest is right)."""
    path = layout / "blobs" / manifest["config"]["digest"].replace(":", "/")
    config = json.loads(path.read_bytes())
    config["config"]["Labels"][media.MREG_MANIFEST_DIGEST] = "sha256:" + "0" * 64
    data = json.dumps(config).encode()
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    manifest["config"] = {**manifest["config"], "digest": f"sha256:{digest}", "size": len(data)}


def _recompressed(layout: Path, manifest: dict[str, Any]) -> None:
    """Every layer gzipped, as a copy that compresses does (the config, and its diff ids, unchanged)."""
    for d in manifest["layers"]:
        data = gzip.compress((layout / "blobs" / d["digest"].replace(":", "/")).read_bytes(), mtime=0)
        digest = hashlib.sha256(data).hexdigest()
        (layout / "blobs" / "sha256" / digest).write_bytes(data)
        d.update(digest=f"sha256:{digest}", size=len(data), mediaType=f"{media.TAR_LAYER}+gzip")


def _as_is(data: bytes) -> Iterator[bytes]:
    yield data


def _endless_listing(w: World) -> Sequence[str | Path]:
    os.environ["AWS_ENDPOINT_URL"] = f"http://{_serve(w, EndlessListing())}"
    os.environ[incoming.MAX_LIST_PAGES_ENV] = "20"
    return ["list", "--store", "s3://b/p"]


def _slow_object(w: World) -> Sequence[str | Path]:
    os.environ["AWS_ENDPOINT_URL"] = f"http://{_serve(w, EndlessListing(slow_objects=True))}"
    os.environ[incoming.STALL_SECONDS_ENV], os.environ[incoming.STALL_BYTES_ENV] = "1", "4096"
    return ["show", "m@1", "--store", "s3://b/p"]


def _no_temp(w: World, _error: dict[str, Any]) -> None:
    """Nothing half-written stays: no temp file in the cache or the store, and no blob past its declared size."""
    left = [p for root in (w.cache, w.store) if root.exists() for p in root.rglob("*") if ".tmp-" in p.name]
    assert not left, left


def _pages_capped(w: World, _error: dict[str, Any]) -> None:
    [server] = w.notes["servers"]
    assert server.pages <= 21, server.pages  # the cap, and boto's one request ahead at most


CASES = [
    Case("oci-pull-layer-past-its-size", _lying("pull", past_the_end), 4, "IntegrityError",
         ("longer than the", "declared"), check=_no_temp),
    Case("oci-sync-layer-past-its-size", _lying("sync", past_the_end), 4, "IntegrityError",
         ("longer than the", "declared"), check=_no_temp),
    Case("oci-pull-layer-shorter-than-declared", _lying("pull", _as_is, grow=1000), 4, "IntegrityError",
         ("short: got",), check=_no_temp),
    Case("oci-pull-one-trickle", _lying("pull", trickle, stall=True), 9, "StoreUnreachable", ("stalled",),
         check=_no_temp),
    Case("oci-sync-one-trickle", _lying("sync", trickle, stall=True), 9, "StoreUnreachable", ("stalled",),
         check=_no_temp),
    Case("oci-image-copy-with-layers-out-of-order", _copied_image(_swapped), 4, "IntegrityError",
         ("not the ones its config lists, in that order",), check=_no_temp),
    Case("oci-image-copy-labelled-for-another-manifest", _copied_image(_other_manifest_label), 4, "IntegrityError",
         ("labels name another mreg manifest",), check=_no_temp),
    Case("oci-image-copy-recompressed", _copied_image(_recompressed), 4, "IntegrityError",
         ("not the ones its config lists",), check=_no_temp),
    Case("s3-object-one-trickle", _slow_object, 9, "StoreUnreachable", ("stalled",)),
    Case("s3-listing-without-end", _endless_listing, 9, "StoreUnreachable", ("did not end after 20 pages",),
         check=_pages_capped),
]


@pytest.fixture
def bounds_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bounds' variables and the S3 credentials recorded, so what a case sets is undone after it."""
    for name in (incoming.STALL_SECONDS_ENV, incoming.STALL_BYTES_ENV, incoming.MAX_LIST_PAGES_ENV,
                 "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (("AWS_ACCESS_KEY_ID", "hostile"), ("AWS_SECRET_ACCESS_KEY", "hostile"),
                        ("AWS_DEFAULT_REGION", "us-east-1")):
        monkeypatch.setenv(name, value)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
@pytest.mark.slow
def test_hostile_remote(case: Case, request: pytest.FixtureRequest, bounds_env: None) -> None:
    try:
        check_case(case, request)
    finally:
        w: World = request.getfixturevalue("world")
        for server in w.notes.get("servers", []):
            server.stop()



@pytest.mark.parametrize("name,value", [(incoming.STALL_BYTES_ENV, "１"), (incoming.STALL_BYTES_ENV, "-1"),
                                        (incoming.STALL_SECONDS_ENV, "0"), (incoming.STALL_SECONDS_ENV, "inf"),
                                        (incoming.MAX_LIST_PAGES_ENV, "0")])
def test_a_bad_bound_is_a_usage_error(name: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.errors import UsageError

    monkeypatch.setenv(name, value)
    with pytest.raises(UsageError, match=name):
        incoming.stall_floor() if name != incoming.MAX_LIST_PAGES_ENV else incoming.max_list_pages()


@pytest.mark.slow
def test_a_killed_pull_leaves_no_temp_after_the_next(world: World, bounds_env: None) -> None:
    """A pull killed while a layer trickles in leaves its temp file (nothing runs after SIGKILL); the next pull of
    that repository removes it first, even one that fails, and the temp never grew past the layer's size."""
    layout, victim, size = _pushed_layout(world)
    with LyingRegistry(layout, TAG, victim, trickle) as server:
        ref = f"oci://{server.host}/t/m:{TAG}"
        env = {**os.environ, incoming.STALL_BYTES_ENV: "0"}  # no floor: it would wait for the whole layer
        child = subprocess.Popen([sys.executable, "-c", "from registry.cli import run; run()", "pull", ref,
                                  "--insecure"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 60
            while not (temps := [p for p in world.cache.rglob("*") if ".tmp-" in p.name]):
                assert child.poll() is None and time.monotonic() < deadline, "the pull never started the layer"
                time.sleep(0.05)
        finally:
            child.kill()
            child.wait()
        assert all(p.stat().st_size <= size for p in temps)
        os.environ[incoming.STALL_SECONDS_ENV], os.environ[incoming.STALL_BYTES_ENV] = "1", "4096"
        r = run("pull", ref, "--insecure", "--json")
        assert r.exit_code == 9 and "stalled" in r.json["error"]["message"], r.stdout
    assert not [p for p in world.cache.rglob("*") if ".tmp-" in p.name]
