"""`mreg push` and `mreg sync`: moving versions between a local store and an S3 store."""

from __future__ import annotations

from typing import Any

import click

from registry.cli import (
    config_option,
    json_option,
    local_store,
    main,
    progress_for,
    s3_store,
    settings_for,
    store_option,
)
from registry.output import Output, human_size


@main.command()
@click.argument("ref", metavar="NAME@REF")
@click.argument("remote", metavar="s3://BUCKET/PREFIX")
@config_option
@store_option
@json_option
def push(ref: str, remote: str, config_path: str | None, store: str | None, as_json: bool) -> None:
    """Copy a local version to an S3 store: only the blobs it lacks, SHA-256 checked by the server.

    The manifest is written last with a create-only PUT, which also allocates the remote version
    number; pushing the same version again uploads nothing.
    """
    from registry.refs import parse_ref
    from registry.remote import push as run_push

    local = local_store(settings_for(config_path, store=store))
    v = local.resolve(parse_ref(ref))
    out = run_push(local, v, s3_store(remote), progress=progress_for(as_json))
    doc = {"name": v.name, "local_version": v.number, "remote": remote, "remote_version": out.version.number,
           "reused": out.reused, "uploaded_blobs": out.uploaded_blobs, "uploaded_bytes": out.uploaded_bytes,
           "present_blobs": out.present_blobs, "manifest_sha256": out.version.manifest_sha256}
    Output(as_json).result(doc, (
        f"✓ {v.name}@{v.number} → {remote} as {v.name}@{out.version.number}"
        + (" (already there; nothing uploaded)" if out.reused else
           f" ({out.uploaded_blobs} blob(s), {human_size(out.uploaded_bytes)} uploaded; "
           f"{out.present_blobs} already there)")))


@main.command()
@click.argument("remote", metavar="s3://BUCKET/PREFIX")
@click.argument("name")
@click.option("--alias", default="production", show_default=True, help="Remote alias to follow.")
@click.option("--watch", type=float, metavar="SECONDS", help="Keep following the alias, checking this often.")
@config_option
@store_option
@json_option
def sync(remote: str, name: str, alias: str, watch: float | None, config_path: str | None, store: str | None,
         as_json: bool) -> None:
    """Materialize a remote alias's version in the local store and flip the local alias to it.

    Every blob is verified while downloaded; the local version is published complete, then the
    local symlink is flipped, so an engine's mount path moves from one complete tree to another.
    With --watch it keeps following the alias until SIGTERM or Ctrl-C (one JSON line per change).
    """
    import signal
    import threading

    from registry.refs import check_alias, check_name
    from registry.remote import sync as run_sync
    from registry.remote import watch as run_watch

    check_name(name)
    check_alias(alias)
    local = local_store(settings_for(config_path, store=store))
    rs = s3_store(remote)
    out = Output(as_json)

    def report(o: Any) -> None:
        doc = {"name": name, "alias": alias, "version": o.version, "changed": o.changed,
               "downloaded_blobs": o.downloaded_blobs, "downloaded_bytes": o.downloaded_bytes,
               "path": str(local.root / "models" / name / alias)}
        out.result(doc, f"✓ {name} {alias} → {o.version}" + (
            f" ({o.downloaded_blobs} blob(s), {human_size(o.downloaded_bytes)} downloaded)" if o.changed else
            " (already current)"))

    report(run_sync(rs, name, alias, local, progress=progress_for(as_json)))
    if watch is None:
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    run_watch(rs, name, alias, local, watch, report, stop, lambda e: out.warn(f"{e} ({getattr(e, 'hint', '')})"))
