"""`mreg push` and `mreg sync`: moving versions between a local store and an S3 store."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from registry import api
from registry.cli.options import (
    config_option,
    json_option,
    local_store,
    progress_for,
    s3_store,
    settings_for,
    store_option,
)
from registry.cli.render import Output
from registry.refs import check_alias, check_name, parse_ref
from registry.units import human_size

if TYPE_CHECKING:
    from registry.store.transfer import SyncOutcome


@click.command("push")
@click.argument("ref", metavar="NAME@REF")
@click.argument("remote", metavar="s3://BUCKET/PREFIX")
@click.option("--verify-remote", is_flag=True,
              help="Also download and hash every blob already in the remote store, and upload again those that "
                   "fail their digest (a plain push checks their size only).")
@config_option
@store_option
@json_option
def push_cmd(ref: str, remote: str, verify_remote: bool, config_path: str | None, store: str | None,
             as_json: bool) -> None:
    """Copy a local version to an S3 store: only the blobs it lacks, SHA-256 checked by the server.

    The manifest is written last with a create-only PUT, which also allocates the remote version
    number; pushing the same version again uploads nothing. A remote blob of the wrong size is sent
    again; one of the right size whose bytes were replaced is found only with --verify-remote,
    which reads every remote blob of the version and repairs those that fail.
    """
    local = local_store(settings_for(config_path, store=store))
    v = local.resolve(parse_ref(ref))
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


@click.command("sync")
@click.argument("remote", metavar="s3://BUCKET/PREFIX")
@click.argument("name")
@click.option("--alias", default="production", show_default=True, help="Remote alias to follow.")
@click.option("--watch", type=float, metavar="SECONDS", help="Keep following the alias, checking this often.")
@config_option
@store_option
@json_option
def sync_cmd(remote: str, name: str, alias: str, watch: float | None, config_path: str | None, store: str | None,
         as_json: bool) -> None:
    """Materialize a remote alias's version in the local store and flip the local alias to it.

    Every blob is verified while downloaded; the local version is published complete, then the
    local symlink is flipped, so an engine's mount path moves from one complete tree to another.
    With --watch it keeps following the alias until SIGTERM or Ctrl-C (one JSON line per change).
    With a trust policy in the config file (`[trust]`, `[models.NAME.trust]`), a version none of
    whose signatures verifies against it is refused (exit 6) before anything is downloaded.
    """
    import signal
    import threading

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

    report(api.sync(rs, name, local, alias=alias, progress=progress_for(as_json), trust=trust))
    if watch is None:
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    api.watch(rs, name, local, alias=alias, every=watch, on_change=report, stop=stop,
              on_error=lambda e: out.warn(f"{e} ({getattr(e, 'hint', '')})"), trust=trust)
