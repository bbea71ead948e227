"""`mreg config` and `mreg pull`: where things are, and bringing sources into the cache."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from registry import api, config
from registry.cli.options import (
    cache_option,
    config_option,
    json_option,
    progress_for,
    pull_options,
    quiet_hub,
    settings_for,
    store_option,
)
from registry.cli.render import Output, table
from registry.units import human_size

if TYPE_CHECKING:
    from registry.cache import Snapshot


@click.command("config")
@config_option
@cache_option
@store_option
@click.option("--env", "show_env", is_flag=True,
              help="Also list every environment variable mreg reads, its value and where that came from "
                   "(the environment, the config file or the default).")
@json_option
def config_cmd(config_path: str | None, cache_dir: str | None, store: str | None, show_env: bool,
               as_json: bool) -> None:
    """Show where the cache and the store are, and where each setting came from."""
    s = settings_for(config_path, cache_dir, store)
    doc: dict[str, Any] = {
        "config_file": str(s.config_path),
        "config_file_exists": s.config_exists,
        "cache_dir": {"value": s.cache_dir.value, "origin": s.cache_dir.origin},
        "store": {"value": s.store.value, "origin": s.store.origin},
        "hf_endpoint": config.HF_ENDPOINT.value(),
    }
    lines = [
        f"config file  {s.config_path}{'' if s.config_exists else ' (absent)'}",
        f"cache dir    {s.cache_dir.value or '(not set)'}  [{s.cache_dir.origin}]",
        f"store        {s.store.value or '(not set)'}  [{s.store.origin}]",
        f"hub endpoint {config.HF_ENDPOINT.value() or f'{config.HF_ENDPOINT.default} (default)'}",
    ]
    if show_env:
        found = [(v, config.resolve(v, s.raw, s.config_path)) for v in config.VARIABLES]
        doc["environment"] = [{"name": v.name, "value": got.value, "origin": got.origin, "meaning": v.meaning}
                              for v, got in found]
        lines += ["", table([[v.name, got.value or "(not set)", got.origin, v.meaning] for v, got in found],
                            ["VARIABLE", "VALUE", "ORIGIN", "WHAT IT DOES"])]
    Output(as_json).result(doc, "\n".join(lines))


def snapshot_doc(snap: Snapshot) -> dict[str, Any]:
    """A snapshot as `mreg pull --json` prints it."""
    src = snap.record.source
    return {
        "repo": src.repo, "kind": src.kind, "revision": src.requested_revision, "commit": src.commit,
        "cache_dir": str(snap.cache), "snapshot": str(snap.path), "files": len(src.files),
        "bytes": sum(f.size for f in src.files), "downloaded_bytes": snap.downloaded_bytes,
        "from_cache": snap.reused, "skipped": list(snap.record.skipped), "linked": snap.linked,
    }


@click.command("pull")
@click.argument("source", metavar="REPO[@REVISION] | ./DIR | file:///DIR | oci://HOST/REPO:TAG | oci-layout:DIR | "
                                  "oci-archive:FILE.tar")
@config_option
@cache_option
@pull_options
@click.option("--copy", is_flag=True,
              help="A local directory: copy its files into the cache instead of linking to them in place.")
@json_option
def pull_cmd(source: str, config_path: str | None, cache_dir: str | None, include: tuple[str, ...],
             exclude: tuple[str, ...], allow_pickle: bool, offline: bool, endpoint: str | None,
             insecure: bool, copy: bool, as_json: bool) -> None:
    """Download a hub repository (or import a local directory) into the cache, pinned and verified.

    Every file is checked against the hub's sha256 (LFS) or git blob id; free space is checked
    before the first byte; pickle weights are skipped unless --allow-pickle. A commit already in
    the cache is served without network. An OCI artifact (oci://…@sha256:… or :TAG, an OCI
    layout, or an OCI archive oci-archive:FILE.tar[:TAG], read in place) lands as a snapshot
    pinned to its manifest digest, every layer checked against its digest; for a version mreg
    pushed (as an artifact, or as an image with --as-image), the snapshot is its hf artifact.

    A local directory is hashed and linked in place, not copied: the snapshot is used only while
    every file keeps the size, times and inode it was hashed with (a changed file means pulling
    again), and conversions copy what they store. --copy keeps a copy in the cache instead, as
    does an import of files written in the last two seconds.
    """
    cache = settings_for(config_path, cache_dir).require_cache()
    quiet_hub(as_json)
    snap = api.pull(source, cache=cache, include=include, exclude=exclude, allow_pickle=allow_pickle,
                    offline=offline, endpoint=endpoint, progress=progress_for(as_json), insecure=insecure, copy=copy)
    doc = snapshot_doc(snap)
    Output(as_json).result(doc, lambda: "\n".join(filter(None, [
        f"✓ {doc['repo']}@{doc['commit'][:12]} ({doc['files']} files, {human_size(doc['bytes'])}"
        f"{_how(snap)})",
        f"  cache    {cache}",
        f"  snapshot {snap.path}",
        f"  skipped  {', '.join(snap.record.skipped)}" if snap.record.skipped else "",
    ])))


def _how(snap: Snapshot) -> str:
    if snap.reused:
        return ", from cache, linked in place" if snap.linked else ", from cache, nothing transferred"
    if snap.linked:
        return ", hashed and linked in place"
    if snap.record.source.kind == "local":
        return ", imported and hashed"
    return f", {human_size(snap.downloaded_bytes)} downloaded"
