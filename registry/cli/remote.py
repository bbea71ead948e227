"""`mreg push` and `mreg sync`: moving versions between a local store and an S3 store or an OCI registry/layout."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import click

from registry import api
from registry.cli.options import (
    FiniteNumber,
    config_option,
    insecure_option,
    json_option,
    local_store,
    progress_for,
    s3_store,
    settings_for,
    store_option,
)
from registry.cli.render import Output
from registry.oci.reference import is_oci
from registry.refs import check_alias, check_name, parse_ref
from registry.units import human_size

if TYPE_CHECKING:
    from registry.store.local import LocalStore
    from registry.store.protocol import Version
    from registry.store.transfer import SyncOutcome


@click.command("push")
@click.argument("ref", metavar="NAME@REF")
@click.argument("remote", metavar="s3://BUCKET/PREFIX | oci://HOST/REPO[:TAG] | oci-layout:DIR[:TAG] | "
                                  "oci-archive:FILE.tar[:TAG]")
@click.option("--force", is_flag=True, help="OCI: move a tag that already names another digest.")
@click.option("--as-image", is_flag=True,
              help="OCI: push a regular image (one tar layer per file under /models/NAME/) for Kubernetes image "
                   "volumes and KServe modelcars, instead of a ModelPack artifact; default tag N-image.")
@click.option("--base", metavar="IMAGE", help="With --as-image: build on this image (oci://…, oci-layout:…, "
                                              "oci-archive:…; linux/amd64 from an index), e.g. busybox for the "
                                              "shell a KServe modelcar runs.")
@insecure_option
@click.option("--verify-remote", is_flag=True,
              help="Also download and hash every blob already in the remote store, and upload again those that "
                   "fail their digest (a plain push checks their size only).")
@config_option
@store_option
@json_option
def push_cmd(ref: str, remote: str, force: bool, as_image: bool, base: str | None, insecure: bool,
             verify_remote: bool, config_path: str | None, store: str | None, as_json: bool) -> None:
    """Copy a local version to an S3 store: only the blobs it lacks, SHA-256 checked by the server.

    The manifest is written last with a create-only PUT, which also allocates the remote version
    number; pushing the same version again uploads nothing. A remote blob of the wrong size is sent
    again; one of the right size whose bytes were replaced is found only with --verify-remote,
    which reads every remote blob of the version and repairs those that fail.

    To an OCI registry (or an OCI image layout directory) the version becomes a ModelPack
    artifact: one uncompressed layer per file, the store's blobs as they are, mreg's manifest as a
    layer; blobs the registry has are not sent; the manifest is PUT last, under TAG (default: the
    version number). A tag naming another digest is refused (exit 5) unless --force. A large blob
    goes in chunks; a push killed mid-blob is resumed by the next one (`resumed_bytes`), and one
    Ctrl-C or SIGTERM stops after the chunk in flight, so that it can be (exit 130). Each signature
    record of the version follows as a referrer of that manifest (a Sigstore-bundle artifact whose
    subject it is: the referrers API, else the `sha256-<hex>` tag); one already listed is not sent.
    oci-archive:FILE.tar is a layout as one tar file (written to a temporary name, then renamed;
    an existing archive is rewritten with the tag added). --as-image pushes a regular image:
    each file as an uncompressed tar layer at /models/NAME/FORMAT/PATH, mreg's manifest at
    /models/NAME/manifest.json (default tag N-image); --base IMAGE puts an image's layers below
    (a KServe modelcar runs a shell in it).
    """
    local = local_store(settings_for(config_path, store=store))
    v = local.resolve(parse_ref(ref))
    if is_oci(remote):
        _push_oci(local, v, remote, force, insecure, as_json, as_image, base)
        return
    if as_image or base:
        raise click.UsageError("--as-image and --base are for OCI destinations (oci://, oci-layout:, oci-archive:)")
    out = api.push(local, v, s3_store(remote), progress=progress_for(as_json), verify_remote=verify_remote)
    doc = {"name": v.name, "local_version": v.number, "remote": remote, "remote_version": out.version.number,
           "reused": out.reused, "uploaded_blobs": out.uploaded_blobs, "uploaded_bytes": out.uploaded_bytes,
           "present_blobs": out.present_blobs, "verified_remote": out.verified_remote,
           "repaired_blobs": out.repaired_blobs, "manifest_sha256": out.version.manifest_sha256,
           "signatures": out.signatures, "signatures_left": out.signatures_left}
    repaired = f"; {out.repaired_blobs} damaged remote blob(s) repaired" if out.repaired_blobs else (
        "; every remote blob verified" if out.verified_remote else "")
    Output(as_json).result(doc, (
        f"✓ {v.name}@{v.number} → {remote} as {v.name}@{out.version.number}"
        + (" (already there; nothing uploaded" if out.reused and not out.uploaded_blobs else
           f" (already there; {out.uploaded_blobs} damaged blob(s) sent again" if out.reused else
           f" ({out.uploaded_blobs} blob(s), {human_size(out.uploaded_bytes)} uploaded; "
           f"{out.present_blobs} already there")
        + repaired + (f"; {out.signatures} signature(s) sent" if out.signatures else "")
        + (f"; {out.signatures_left} signature(s) left behind: the remote number differs, so the signed manifest "
           "does not match" if out.signatures_left else "") + ")"))


@contextlib.contextmanager
def stop_on_signals(output: Output) -> Iterator[threading.Event]:
    """SIGINT or SIGTERM once: the push finishes the chunk it is sending and stops where the next push resumes
    (distribution drops an upload whose PATCH was cut); a second one stops at once (KeyboardInterrupt)."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: Any) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        output.warn(f"{signal.Signals(signum).name}: stopping after the chunk being sent (again to stop now)")

    with _handling_signals(handler):
        yield stop


@contextlib.contextmanager
def _handling_signals(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """SIGINT and SIGTERM go to `handler` inside the block; the handlers that were there before are put back after
    it (a caller in the same process, a test runner, keeps its own)."""
    old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def _push_oci(local: LocalStore, v: Version, remote: str, force: bool, insecure: bool, as_json: bool,
              as_image: bool, base: str | None) -> None:
    with stop_on_signals(Output(as_json)) as stop:
        out = api.push(local, v, remote, force=force, insecure=insecure, progress=progress_for(as_json),
                       as_image=as_image, base=base, stop=stop)
    doc = {"name": v.name, "local_version": v.number, "remote": remote, "as_image": as_image, "base": base,
           "tag": out.tag, "digest": out.digest,
           "reused": out.reused, "uploaded_blobs": out.uploaded_blobs, "uploaded_bytes": out.uploaded_bytes,
           "present_blobs": out.present_blobs, "replaced": out.replaced, "resumed_bytes": out.resumed_bytes,
           "signatures": out.signatures}
    signed = f"; {out.signatures} signature(s) sent" if out.signatures else ""
    Output(as_json).result(doc, (
        f"✓ {v.name}@{v.number} → {remote} (tag {out.tag}, {out.digest[:19]}…; "
        + (f"already there; nothing uploaded{signed})" if out.reused else
           f"{out.uploaded_blobs} blob(s), {human_size(out.uploaded_bytes)} uploaded; {out.present_blobs} "
           "already there" + (f"; {human_size(out.resumed_bytes)} resumed from an interrupted upload"
                              if out.resumed_bytes else "")
           + (f"; tag moved from {out.replaced[:19]}…" if out.replaced else "") + signed + ")")))


@click.command("sync")
@click.argument("remote", metavar="s3://BUCKET/PREFIX | oci://HOST/REPO:TAG|@DIGEST | oci-layout:DIR[:TAG] | "
                                  "oci-archive:FILE.tar[:TAG]")
@click.argument("name", required=False)
@click.option("--alias", default="production", show_default=True,
              help="Remote alias to follow (S3); the local alias to flip (both).")
@insecure_option
@click.option("--watch", type=FiniteNumber(0, 86400, open_low=True), metavar="SECONDS",
              help="Keep following the alias, checking this often.")
@config_option
@store_option
@json_option
def sync_cmd(remote: str, name: str | None, alias: str, insecure: bool, watch: float | None, config_path: str | None,
             store: str | None, as_json: bool) -> None:
    """Materialize a remote alias's version in the local store and flip the local alias to it.

    Every blob is verified while downloaded; the local version is published complete, then the
    local symlink is flipped, so an engine's mount path moves from one complete tree to another.
    With --watch it keeps following the alias until SIGTERM or Ctrl-C (one JSON line per change).

    From OCI (a registry, a layout directory or an oci-archive:FILE.tar, read in place; NAME
    optional: the artifact names its version), the version mreg pushed there is reproduced
    exactly, under its number, every layer verified, and the local --alias flips to it (from an
    image pushed with --as-image too); its signatures come from the artifact's referrers
    (Sigstore bundles whose subject it is).

    With a trust policy in the config file (`[trust]`, `[models.NAME.trust]`), a version none of
    whose signatures verifies against it is refused (exit 6) before anything is downloaded, and
    the local alias is left as it was; the valid records are kept beside the local copy.
    """
    if is_oci(remote):
        if watch is not None:
            raise click.UsageError("--watch follows S3 aliases; an OCI tag is not an alias")
        settings = settings_for(config_path, store=store)
        local = local_store(settings)
        o = api.sync(local, remote, name, alias=alias, insecure=insecure, progress=progress_for(as_json),
                     trust=lambda n: api.trust_policy(settings, n))
        doc = {"name": o.name, "alias": alias, "version": o.version, "digest": o.digest, "changed": o.changed,
               "downloaded_blobs": o.downloaded_blobs, "downloaded_bytes": o.downloaded_bytes,
               "signatures": o.signatures, "path": local.alias_mount(o.name, alias)}
        Output(as_json).result(doc, f"✓ {o.name} {alias} → {o.version}" + (
            f" ({o.downloaded_blobs} blob(s), {human_size(o.downloaded_bytes)} downloaded)" if o.changed else
            " (already current)") + (f"; {o.signatures} signature record(s) kept" if o.signatures else ""))
        return
    if name is None:
        raise click.UsageError("NAME is required when syncing from S3")
    check_name(name)
    check_alias(alias)
    settings = settings_for(config_path, store=store)
    local = local_store(settings)
    trust = api.trust_policy(settings, name)
    rs = s3_store(remote)
    out = Output(as_json)

    def report(o: SyncOutcome) -> None:
        doc = {"name": name, "alias": alias, "version": o.version, "changed": o.changed,
               "downloaded_blobs": o.downloaded_blobs, "downloaded_bytes": o.downloaded_bytes,
               "path": local.alias_mount(name, alias)}
        out.result(doc, f"✓ {name} {alias} → {o.version}" + (
            f" ({o.downloaded_blobs} blob(s), {human_size(o.downloaded_bytes)} downloaded)" if o.changed else
            " (already current)"))

    report(api.sync(local, rs, name, alias=alias, progress=progress_for(as_json), trust=trust))
    if watch is None:
        return
    stop = threading.Event()
    with _handling_signals(lambda *_: stop.set()):
        api.watch(local, rs, name, alias=alias, every=watch, on_change=report, stop=stop,
                  on_error=lambda e: out.warn(f"{e} ({getattr(e, 'hint', '')})"), trust=trust)
