"""The `mreg` command: parse, call the library, render. The one place errors become exit codes."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from registry import __version__
from registry.errors import EXIT_CODES, MregError, UsageError
from registry.output import BarProgress, Output, human_size, table

F = TypeVar("F", bound=Callable[..., Any])

EPILOG = "Exit codes: " + "; ".join(f"{k} {v}" for k, v in EXIT_CODES.items()) + "."


class MregGroup(click.Group):
    """A click group whose invoke is mreg's error boundary."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command; map MregError to one line, a hint and its exit code."""
        try:
            return super().invoke(ctx)
        except MregError as e:
            if os.environ.get("MREG_DEBUG"):
                traceback.print_exc()
            Output(_json_requested(ctx)).error(e)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            sys.stderr.write("interrupted; nothing partial was published\n")
            ctx.exit(130)


def _json_requested(ctx: click.Context) -> bool:
    return bool(ctx.meta.get("mreg.json")) or "--json" in sys.argv


def _set_json(ctx: click.Context, _param: click.Parameter, value: bool) -> bool:
    if value:
        ctx.meta["mreg.json"] = True
    return value


def json_option(f: F) -> F:
    """`--json`: one JSON document on stdout, no progress bars."""
    return click.option("--json", "as_json", is_flag=True, is_eager=True, callback=_set_json,
                        help="Print one JSON document (with schema_version) instead of text; no progress bars.")(f)


def config_option(f: F) -> F:
    """`--config`."""
    return click.option("--config", "config_path", metavar="FILE", envvar="MREG_CONFIG",
                        help="Config file (TOML). Default: $XDG_CONFIG_HOME/mreg/config.toml.")(f)


def _set_endpoint(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value:
        ctx.meta["mreg.endpoint_url"] = value


def store_option(f: F) -> F:
    """`--store` and `--endpoint-url`."""
    f = click.option("--endpoint-url", metavar="URL", expose_value=False, callback=_set_endpoint,
                     help="S3 endpoint for s3:// stores (else $AWS_ENDPOINT_URL; AWS when unset).")(f)
    return click.option("--store", metavar="DIR|s3://BUCKET/PREFIX",
                        help="Store: a directory or s3://bucket/prefix. Else $MREG_STORE, else `store` in the "
                             "config file.")(f)


def cache_option(f: F) -> F:
    """`--cache-dir`."""
    return click.option("--cache-dir", metavar="DIR",
                        help="Cache root. Else $MREG_CACHE_DIR, else `cache_dir` in the config file.")(f)


def _settings(config_path: str | None, cache_dir: str | None = None, store: str | None = None) -> Any:
    from registry import config

    return config.load(config_path, cache_dir, store)


def _local_store(settings: Any) -> Any:
    from registry.store import LocalStore

    location = settings.require_store()
    if location.startswith("s3://"):
        raise UsageError(f"this command works on a local store, not {location}",
                         hint="give a directory with --store; use `mreg push` / `mreg sync` to move versions")
    return LocalStore(Path(location))


def _s3(url: str) -> Any:
    from registry.s3store import S3Store

    return S3Store(url, endpoint_url=click.get_current_context().meta.get("mreg.endpoint_url"))


def _any_store(settings: Any) -> Any:
    location = settings.require_store()
    return _s3(location) if location.startswith("s3://") else _local_store(settings)


def _progress(as_json: bool) -> BarProgress:
    return BarProgress(enabled=not as_json and sys.stderr.isatty())


def _quiet_hub(as_json: bool) -> None:
    if as_json or not sys.stderr.isatty():
        from huggingface_hub import utils as hf_utils

        hf_utils.disable_progress_bars()  # type: ignore[attr-defined]


@click.group(cls=MregGroup, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mreg")
def main() -> None:
    """mreg: pull models into an explicit cache, convert and verify them, publish immutable
    versions to a store, and release them with atomic alias flips.

    \b
    The loop:
      mreg pull Qwen/Qwen2.5-7B-Instruct            # into --cache-dir, pinned to a commit
      mreg convert Qwen/Qwen2.5-7B-Instruct --to hf --name qwen   # new version in --store
      mreg promote qwen@1                           # production -> versions/1, atomically
      mreg resolve qwen@production --format hf      # the path a serving engine mounts
      mreg rollback qwen                            # production back to where it was
    """


@main.command("config")
@config_option
@cache_option
@store_option
@json_option
def config_cmd(config_path: str | None, cache_dir: str | None, store: str | None, as_json: bool) -> None:
    """Show where the cache and the store are, and where each setting came from."""
    s = _settings(config_path, cache_dir, store)
    doc = {
        "config_file": str(s.config_path),
        "config_file_exists": s.config_exists,
        "cache_dir": {"value": s.cache_dir.value, "origin": s.cache_dir.origin},
        "store": {"value": s.store.value, "origin": s.store.origin},
        "hf_endpoint": os.environ.get("HF_ENDPOINT"),
    }
    Output(as_json).result(doc, lambda: "\n".join([
        f"config file  {s.config_path}{'' if s.config_exists else ' (absent)'}",
        f"cache dir    {s.cache_dir.value or '(not set)'}  [{s.cache_dir.origin}]",
        f"store        {s.store.value or '(not set)'}  [{s.store.origin}]",
        f"hub endpoint {os.environ.get('HF_ENDPOINT') or 'https://huggingface.co (default)'}",
    ]))


def pull_options(f: F) -> F:
    """Options shared by pull and convert."""
    for opt in reversed([
        click.option("--include", multiple=True, metavar="GLOB", help="Only files matching (repeatable)."),
        click.option("--exclude", multiple=True, metavar="GLOB", help="Skip files matching (repeatable)."),
        click.option("--allow-pickle", is_flag=True,
                     help="Also fetch pickle weights (.bin/.pt/.pth/.ckpt/.pkl); they can run code when loaded."),
        click.option("--offline", is_flag=True, help="Use only the cache; never contact the hub."),
        click.option("--endpoint", envvar="HF_ENDPOINT", metavar="URL", help="Hub endpoint (default $HF_ENDPOINT)."),
    ]):
        f = opt(f)
    return f


def _do_pull(cache: Path, source: str, include: tuple[str, ...], exclude: tuple[str, ...], allow_pickle: bool,
             offline: bool, endpoint: str | None, as_json: bool) -> Any:
    from registry.cache import pull

    _quiet_hub(as_json)
    return pull(cache, source, include=include, exclude=exclude, allow_pickle=allow_pickle, offline=offline,
                endpoint=endpoint, progress=_progress(as_json))


def _snapshot_doc(snap: Any) -> dict[str, Any]:
    src = snap.record.source
    return {
        "repo": src.repo, "kind": src.kind, "revision": src.requested_revision, "commit": src.commit,
        "cache_dir": str(snap.cache), "snapshot": str(snap.path), "files": len(src.files),
        "bytes": sum(f.size for f in src.files), "downloaded_bytes": snap.downloaded_bytes,
        "from_cache": snap.reused, "skipped": list(snap.record.skipped),
    }


@main.command()
@click.argument("source", metavar="REPO[@REVISION] | ./DIR | file:///DIR")
@config_option
@cache_option
@pull_options
@json_option
def pull(source: str, config_path: str | None, cache_dir: str | None, include: tuple[str, ...],
         exclude: tuple[str, ...], allow_pickle: bool, offline: bool, endpoint: str | None, as_json: bool) -> None:
    """Download a hub repository (or import a local directory) into the cache, pinned and verified.

    Every file is checked against the hub's sha256 (LFS) or git blob id; free space is checked
    before the first byte; pickle weights are skipped unless --allow-pickle. A commit already in
    the cache is served without network.
    """
    cache = _settings(config_path, cache_dir).require_cache()
    snap = _do_pull(cache, source, include, exclude, allow_pickle, offline, endpoint, as_json)
    doc = _snapshot_doc(snap)
    Output(as_json).result(doc, lambda: "\n".join(filter(None, [
        f"✓ {doc['repo']}@{doc['commit'][:12]} ({doc['files']} files, {human_size(doc['bytes'])}"
        f"{_how(snap)})",
        f"  cache    {cache}",
        f"  snapshot {snap.path}",
        f"  skipped  {', '.join(snap.record.skipped)}" if snap.record.skipped else "",
    ])))


def _how(snap: Any) -> str:
    if snap.reused:
        return ", from cache, nothing transferred"
    if snap.record.source.kind == "local":
        return ", imported and hashed"
    return f", {human_size(snap.downloaded_bytes)} downloaded"


def _parse_target(text: str) -> tuple[str, dict[str, Any]]:
    fmt, _, spec = text.partition(":")
    return fmt, ({"spec": spec} if spec else {})


@main.command()
@click.argument("source", metavar="REPO[@REVISION] | ./DIR")
@click.option("--to", "targets", multiple=True, required=True, metavar="FORMAT[:SPEC]",
              help="Target format (repeatable; all share one read of the source). Available: hf.")
@click.option("--name", required=True, help="Model name in the store.")
@click.option("--copy", is_flag=True,
              help="Copy files into the store instead of hard-linking them from the cache.")
@config_option
@cache_option
@store_option
@pull_options
@json_option
def convert(source: str, targets: tuple[str, ...], name: str, copy: bool, config_path: str | None,
            cache_dir: str | None, store: str | None, include: tuple[str, ...], exclude: tuple[str, ...],
            allow_pickle: bool, offline: bool, endpoint: str | None, as_json: bool) -> None:
    """Convert a source (pulled into the cache first if needed) into a new, verified version.

    The same conversion (same source bytes, converter, options and tool versions) run again
    returns the existing version without new work.
    """
    from registry.convert import convert as run_convert

    settings = _settings(config_path, cache_dir, store)
    st = _local_store(settings)
    cache = settings.require_cache()
    snap = _do_pull(cache, source, include, exclude, allow_pickle, offline, endpoint, as_json)
    outcome = run_convert(st, snap, name, [_parse_target(t) for t in targets], copy=copy,
                          progress=_progress(as_json))
    v = outcome.version
    doc = {
        "name": name, "version": v.number, "reused": outcome.reused, "path": v.path,
        "manifest_sha256": v.manifest_sha256, "key": v.manifest.key,
        "formats": [a.format for a in v.manifest.artifacts],
        "verification": {a.format: a.verification.status for a in v.manifest.artifacts},
        "source": {"repo": snap.record.source.repo, "commit": snap.record.source.commit},
        "duration_s": round(outcome.duration_s, 3),
    }
    verb = "exists" if outcome.reused else "published"
    checks = ", ".join(f"{a.format} {a.verification.status}" for a in v.manifest.artifacts)
    Output(as_json).result(doc, lambda: "\n".join([
        f"✓ {name}@{v.number} {verb} ({', '.join(a.format for a in v.manifest.artifacts)}; verification {checks})",
        f"  path     {v.path}",
        f"  manifest sha256:{v.manifest_sha256[:16]}",
    ]))


@main.command("list")
@click.argument("name", required=False)
@config_option
@store_option
@json_option
def list_cmd(name: str | None, config_path: str | None, store: str | None, as_json: bool) -> None:
    """List the models in the store, or the versions of one model."""
    st = _any_store(_settings(config_path, store=store))
    out = Output(as_json)
    if name is None:
        models = [{"name": m, "versions": len(st.versions(m)), "aliases": st.aliases(m)} for m in st.models()]
        out.result({"store": st.location, "models": models}, lambda: table(
            [[m["name"], str(m["versions"]), ", ".join(f"{a}→{n}" for a, n in m["aliases"].items())]
             for m in models], ["MODEL", "VERSIONS", "ALIASES"]) if models else "(no models)")
        return
    from registry.errors import ModelNotFound
    from registry.refs import check_name

    check_name(name)
    if name not in st.models():
        raise ModelNotFound(name)
    aliases = st.aliases(name)
    rows = []
    for n in st.versions(name):
        v = st.version(name, n)
        m = v.manifest
        rows.append({
            "version": n, "formats": [a.format for a in m.artifacts],
            "aliases": sorted(a for a, t in aliases.items() if t == n),
            "source": f"{m.source.repo}@{m.source.commit[:12]}", "created": m.created.at.isoformat(),
            "manifest_sha256": v.manifest_sha256, "bytes": sum(f.size for a in m.artifacts for f in a.files),
        })
    out.result({"name": name, "versions": rows}, lambda: table(
        [[str(r["version"]), ",".join(r["formats"]), ",".join(r["aliases"]), r["source"],
          human_size(r["bytes"]), r["created"][:19], r["manifest_sha256"][:12]] for r in rows],
        ["VERSION", "FORMATS", "ALIASES", "SOURCE", "SIZE", "CREATED", "MANIFEST"]))


@main.command()
@click.argument("ref", metavar="NAME[@REF]")
@config_option
@store_option
@json_option
def show(ref: str, config_path: str | None, store: str | None, as_json: bool) -> None:
    """Show a version's manifest (REF: number, alias, `latest`, or manifest digest prefix)."""
    from registry.refs import parse_ref
    from registry.store import manifest_json

    st = _any_store(_settings(config_path, store=store))
    v = st.resolve(parse_ref(ref))
    aliases = sorted(a for a, n in st.aliases(v.name).items() if n == v.number)
    doc = {"name": v.name, "version": v.number, "path": v.path, "manifest_sha256": v.manifest_sha256,
           "aliases": aliases, "manifest": manifest_json(v.manifest)}
    m = v.manifest

    def human() -> str:
        lines = [f"{v.name}@{v.number}  {', '.join(aliases)}".rstrip(),
                 f"  manifest  sha256:{v.manifest_sha256}",
                 f"  path      {v.path}",
                 f"  source    {m.source.repo}@{m.source.commit} ({m.source.kind}, {len(m.source.files)} files)",
                 f"  created   {m.created.at.isoformat()} by {m.created.user}@{m.created.host}",
                 f"  key       {m.key}"]
        for a in m.artifacts:
            size = sum(f.size for f in a.files)
            lines.append(f"  {a.format:<9} {len(a.files)} files, {human_size(size)}, {a.converter.name} "
                         f"{a.converter.version}, verification {a.verification.status}: {a.verification.method}")
        return "\n".join(lines)

    Output(as_json).result(doc, human)


@main.command()
@click.argument("name")
@click.option("--alias", default=None, help="Only this alias.")
@config_option
@store_option
@json_option
def history(name: str, alias: str | None, config_path: str | None, store: str | None, as_json: bool) -> None:
    """Show every alias change of a model: who, when, from, to, why."""
    from registry.refs import check_name

    check_name(name)
    st = _any_store(_settings(config_path, store=store))
    entries = [e for e in st.history(name) if alias is None or e.alias == alias]
    docs = [e.model_dump(mode="json", by_alias=True) for e in entries]
    Output(as_json).result({"name": name, "entries": docs}, lambda: table(
        [[e.by.at.isoformat()[:19], e.alias, e.action, str(e.from_version or "-"), str(e.to_version),
          f"{e.by.user}@{e.by.host}", e.reason or ""] for e in entries],
        ["WHEN", "ALIAS", "ACTION", "FROM", "TO", "BY", "WHY"]) if entries else "(no alias changes)")


def _change_doc(c: Any) -> dict[str, Any]:
    return {"name": c.name, "alias": c.alias, "from": c.from_version, "to": c.to_version, "changed": c.changed,
            "action": c.action}


def _change_text(c: Any) -> str:
    if not c.changed:
        return f"✓ {c.name} {c.alias} already at {c.to_version}; nothing changed"
    return f"✓ {c.name} {c.alias}: {c.from_version if c.from_version is not None else '(unset)'} → {c.to_version}"


@main.command()
@click.argument("ref", metavar="NAME@VERSION")
@click.option("--alias", default="production", show_default=True, help="Alias to move.")
@click.option("--expect", metavar="VERSION|none", help="Only if the alias currently points here (else exit 5).")
@click.option("-m", "--message", help="Why (recorded in the history).")
@click.option("--require", multiple=True, metavar="FORMAT", help="Refuse unless the version has this format.")
@click.option("--force", is_flag=True, help="Promote even when a gate refuses.")
@click.option("--reload", "reload_cmd", metavar="CMD", help="After the flip, run this (sh -c) so the engine reloads.")
@click.option("--reload-url", metavar="URL", help="After the flip, POST to this URL (an engine's reload endpoint).")
@click.option("--ready-url", metavar="URL", help="Then GET this until it answers 2xx.")
@click.option("--ready-cmd", metavar="CMD", help="Then run this until it exits 0.")
@click.option("--ready-timeout", type=float, metavar="SECONDS", help="How long to wait for readiness (default 60).")
@config_option
@store_option
@json_option
def promote(ref: str, alias: str, expect: str | None, message: str | None, require: tuple[str, ...], force: bool,
            reload_cmd: str | None, reload_url: str | None, ready_url: str | None, ready_cmd: str | None,
            ready_timeout: float | None, config_path: str | None, store: str | None, as_json: bool) -> None:
    """Point an alias at a version with one atomic symlink flip, and record it in the history.

    Gates: a version whose verification failed, or without a --require'd format, is refused
    (exit 6) unless --force. Promoting to the current target changes nothing.

    Hooks (flags, or `[models.NAME]` in the config file: reload, reload_url, ready_url,
    ready_cmd, ready_timeout): after the flip mreg reloads the engine and waits until it is
    ready; if it is not, the alias is flipped back, both changes are recorded, and mreg exits 10.
    Commands see MREG_NAME, MREG_ALIAS, MREG_VERSION, MREG_FROM_VERSION, MREG_PATH.
    """
    from registry import hooks as promotion_hooks
    from registry.aliases import parse_expect
    from registry.refs import parse_ref

    settings = _settings(config_path, store=store)
    st = _any_store(settings)
    r = parse_ref(ref)
    hooks = promotion_hooks.merge(promotion_hooks.from_config(settings.raw, r.name), reload_cmd=reload_cmd,
                                  reload_url=reload_url, ready_url=ready_url, ready_cmd=ready_cmd,
                                  ready_timeout_s=ready_timeout)
    configured = settings.raw.get("models", {}).get(r.name, {}).get("require", [])
    done = promotion_hooks.promote_with_hooks(st, r.name, st.resolve(r), hooks, alias=alias,
                                              expect=parse_expect(expect), reason=message, force=force,
                                              require=(*configured, *require))
    doc = _change_doc(done.change)
    if done.report is not None:
        doc["hooks"] = {"ready": done.report.ready, "seconds": round(done.report.seconds, 3),
                        "steps": list(done.report.steps)}
    Output(as_json).result(doc, _change_text(done.change) + (
        f" (engine ready after {done.report.seconds:.1f}s)" if done.report else ""))


@main.command("mount-check")
@click.argument("name")
@click.option("--alias", default="production", show_default=True, help="Alias the engine follows.")
@click.option("--mount-root", metavar="PATH", help="Where the engine sees the store root (e.g. /models).")
@click.option("--verify", "full", is_flag=True, help="Re-hash every file of the target (default: sizes only).")
@config_option
@store_option
@json_option
def mount_check_cmd(name: str, alias: str, mount_root: str | None, full: bool, config_path: str | None,
                    store: str | None, as_json: bool) -> None:
    """Check a deployment against the mount contract and print the path each engine should read.

    The contract: mount the store root (read-only is enough), point the engine at
    models/NAME/ALIAS/FORMAT/…; the alias is a relative link inside the root; nothing under the
    model is a separate mount (a subPath or single-file mount never sees a flip). Exit 1 on a
    violation.
    """
    from registry.mount import mount_check
    from registry.refs import check_alias, check_name

    check_name(name)
    check_alias(alias)
    report = mount_check(_local_store(_settings(config_path, store=store)), name, alias, mount_root=mount_root,
                         verify=full)
    doc = {"name": name, "alias": alias, "version": report.version, "ok": report.ok,
           "problems": list(report.problems), "paths": report.paths}
    Output(as_json).result(doc, lambda: "\n".join(
        ([f"✓ {name} {alias} → {report.version} meets the mount contract"] if report.ok else
         [f"✗ {name} {alias}:"] + [f"    {p}" for p in report.problems])
        + [f"  {fmt:<9} {path}" for fmt, path in report.paths.items()]))
    if not report.ok:
        Output(False).error(MregError(f"{name} {alias} does not meet the mount contract",
                                      hint="see the problems above and the README's serving section"))
        click.get_current_context().exit(1)


@main.command()
@click.argument("name")
@click.option("--alias", default="production", show_default=True, help="Alias to move back.")
@click.option("--to", "to", type=int, help="Go to this version instead of the previous one.")
@click.option("--expect", metavar="VERSION", help="Only if the alias currently points here (else exit 5).")
@click.option("-m", "--message", help="Why (recorded in the history).")
@config_option
@store_option
@json_option
def rollback(name: str, alias: str, to: int | None, expect: str | None, message: str | None,
             config_path: str | None, store: str | None, as_json: bool) -> None:
    """Move an alias back to the version it pointed at before; repeat to walk further back."""
    from registry.aliases import parse_expect
    from registry.aliases import rollback as run_rollback

    st = _any_store(_settings(config_path, store=store))
    change = run_rollback(st, name, alias=alias, to=to, expect=parse_expect(expect), reason=message)
    Output(as_json).result(_change_doc(change), _change_text(change))


@main.command()
@click.argument("ref", metavar="NAME[@REF]")
@click.option("--format", "fmt", default="hf", show_default=True, help="Artifact format.")
@click.option("--physical", is_flag=True, help="Print the version directory instead of the alias path.")
@config_option
@store_option
@json_option
def resolve(ref: str, fmt: str, physical: bool, config_path: str | None, store: str | None, as_json: bool) -> None:
    """Print the path a serving engine should mount for a version's artifact.

    For an alias (NAME@production) this is the alias path, which follows promotions and
    rollbacks; for a number it is the immutable version directory.
    """
    from registry import layout
    from registry.errors import NotFound
    from registry.refs import parse_ref

    st = _any_store(_settings(config_path, store=store))
    r = parse_ref(ref, default="production")
    v = st.resolve(r)
    art = next((a for a in v.manifest.artifacts if a.format == fmt), None)
    if art is None:
        have = ", ".join(a.format for a in v.manifest.artifacts)
        raise NotFound(f"{v.name}@{v.number} has no {fmt} artifact (it has {have})",
                       hint=f"run `mreg convert ... --to {fmt} --name {v.name}`")
    is_alias = r.number is None and st.alias(r.name, r.ref) is not None
    version_path = f"{v.path}/{art.path}"
    if hasattr(st, "root") and is_alias and not physical:
        path = str(layout.alias_path(st.root, v.name, r.ref) / art.path)
    else:
        path = version_path  # remote stores: the immutable version prefix (mount it with `mreg sync`)
    doc = {"name": v.name, "version": v.number, "format": fmt, "path": path,
           "version_path": version_path, "alias": r.ref if is_alias else None}
    Output(as_json).result(doc, path)


@main.command()
@click.argument("refs", nargs=-1, metavar="[NAME@REF]...")
@click.option("--all", "all_", is_flag=True, help="Verify every version in the store.")
@config_option
@store_option
@json_option
def verify(refs: tuple[str, ...], all_: bool, config_path: str | None, store: str | None, as_json: bool) -> None:
    """Re-hash every file of the given versions offline; exit 4 on any mismatch, missing or extra file."""
    from registry.errors import IntegrityError
    from registry.refs import parse_ref
    from registry.verify import verify_version

    st = _any_store(_settings(config_path, store=store))
    if not refs and not all_:
        raise UsageError("nothing to verify", hint="give NAME@REF arguments or --all")
    versions = [st.resolve(parse_ref(r)) for r in refs]
    if all_:
        versions += [st.version(m, n) for m in st.models() for n in st.versions(m)]
    if hasattr(st, "root"):
        reports: list[Any] = [verify_version(st, v, _progress(as_json)) for v in versions]
    else:
        from registry.remote import verify_remote

        reports = [verify_remote(st, v) for v in versions]
    bad = [r for r in reports if not r.ok]
    docs = [{"name": r.name, "version": r.version, "files": r.files, "bytes": r.bytes, "ok": r.ok,
             "problems": list(r.problems)} for r in reports]
    out = Output(as_json)
    out.result({"ok": not bad, "versions": docs}, lambda: "\n".join(
        (f"✓ {r.name}@{r.version}: {r.files} files, {human_size(r.bytes)} match their digests" if r.ok else
         f"✗ {r.name}@{r.version}:\n" + "\n".join(f"    {p}" for p in r.problems)) for r in reports))
    if bad:
        # The report above is the one JSON document; the error goes to stderr only.
        err = IntegrityError(
            f"{len(bad)} of {len(reports)} version(s) failed verification: "
            + ", ".join(f"{r.name}@{r.version}" for r in bad),
            hint="re-publish the damaged versions from their source (`mreg convert`), then `mreg gc --yes`",
        )
        Output(False).error(err)
        click.get_current_context().exit(err.exit_code)


@main.command()
@click.option("--keep-history", default=10, show_default=True, help="Keep versions named by the last N alias changes.")
@click.option("--keep-latest", default=3, show_default=True, help="Keep the newest K versions of each model.")
@click.option("--dry-run", is_flag=True, help="Only show the plan (the default without --yes).")
@click.option("--yes", is_flag=True, help="Carry out the plan.")
@click.option("--grace-hours", default=24.0, show_default=True,
              help="S3 stores: only blobs older than this are removed (pushes in flight are protected by leases).")
@config_option
@store_option
@json_option
def gc(keep_history: int, keep_latest: int, dry_run: bool, yes: bool, grace_hours: float, config_path: str | None,
       store: str | None, as_json: bool) -> None:
    """Remove unreachable versions, blobs and leftovers of interrupted writes (plan only unless --yes).

    Never removes a version an alias points to, one named by the last --keep-history alias
    changes, or one of the newest --keep-latest versions. On S3, only unreferenced blobs older
    than --grace-hours are removed; versions are kept.
    """
    from registry.gc import execute_gc, plan_gc

    st = _any_store(_settings(config_path, store=store))
    applied = yes and not dry_run
    if not hasattr(st, "root"):
        from registry.remote import gc_remote

        res = gc_remote(st, grace_s=grace_hours * 3600, apply=applied)
        Output(as_json).result(
            {"applied": applied, "versions": [], "blobs": len(res.blobs), "blob_bytes": res.blob_bytes,
             "stale_leases": len(res.leases), "kept": []},
            f"{'removed' if applied else 'would remove'}: {len(res.blobs)} blob(s) ({human_size(res.blob_bytes)}),"
            f" {len(res.leases)} stale lease(s)" + ("" if applied else "\nrun again with --yes to carry this out"))
        return
    plan = plan_gc(st, keep_history=keep_history, keep_latest=keep_latest)
    if applied:
        plan = execute_gc(st, plan)
    doc = {"applied": applied, "versions": [{"name": n, "version": v} for n, v in plan.versions],
           "blobs": len(plan.blobs), "blob_bytes": plan.blob_bytes, "staging": list(plan.staging),
           "kept": [{"name": n, "version": v, "why": w} for n, v, w in plan.kept]}
    verb = "removed" if applied else "would remove"

    def human() -> str:
        lines = [f"{verb}: {len(plan.versions)} version(s), {len(plan.blobs)} blob(s) "
                 f"({human_size(plan.blob_bytes)}), {len(plan.staging)} interrupted write(s)"]
        lines += [f"  - {n}@{v}" for n, v in plan.versions]
        lines += [f"  kept {n}@{v}: {w}" for n, v, w in plan.kept]
        if not applied:
            lines.append("run again with --yes to carry this out")
        return "\n".join(lines)

    Output(as_json).result(doc, human)


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

    local = _local_store(_settings(config_path, store=store))
    v = local.resolve(parse_ref(ref))
    out = run_push(local, v, _s3(remote), progress=_progress(as_json))
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
    local = _local_store(_settings(config_path, store=store))
    rs = _s3(remote)
    out = Output(as_json)

    def report(o: Any) -> None:
        doc = {"name": name, "alias": alias, "version": o.version, "changed": o.changed,
               "downloaded_blobs": o.downloaded_blobs, "downloaded_bytes": o.downloaded_bytes,
               "path": str(local.root / "models" / name / alias)}
        out.result(doc, f"✓ {name} {alias} → {o.version}" + (
            f" ({o.downloaded_blobs} blob(s), {human_size(o.downloaded_bytes)} downloaded)" if o.changed else
            " (already current)"))

    report(run_sync(rs, name, alias, local, progress=_progress(as_json)))
    if watch is None:
        return
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    run_watch(rs, name, alias, local, watch, report, stop, lambda e: out.warn(f"{e} ({getattr(e, 'hint', '')})"))


@main.command()
@click.argument("ref", metavar="NAME@REF")
@click.option("--golden", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Golden cases, one JSON object per line.")
@click.option("--format", "fmt", type=click.Choice(["hf", "gguf"]), help="Artifact to run (default: gguf, else hf).")
@click.option("--min-hit-rate", default=1.0, show_default=True, help="Share of `contains` keywords that must hit.")
@click.option("--record-baseline", is_flag=True, help="Store these outputs as the expected ones for later versions.")
@config_option
@store_option
@json_option
def check(ref: str, golden: Path, fmt: str | None, min_hit_rate: float, record_baseline: bool,
          config_path: str | None, store: str | None, as_json: bool) -> None:
    """Run a golden set through a version's artifact (greedy, fixed seed) and record the result.

    Each case gives `prompt`, `messages` (rendered with the model's chat template) or `text`
    (encoders), and `expect`: contains / not_contains (keywords), regex, json (true or a JSON
    Schema), max_latency_ms, min_tokens_per_s, min_cosine. Once a baseline is recorded, later
    versions must reproduce its outputs. The record is kept beside the version (the manifest is
    not touched); `mreg promote --require check[:GOLDEN]` insists on a passing one. Exit 11 on failure.
    """
    from registry.check import load_golden, run_check
    from registry.errors import CheckFailed
    from registry.refs import parse_ref

    st = _local_store(_settings(config_path, store=store))
    v = st.resolve(parse_ref(ref))
    rec = run_check(st, v, load_golden(golden), fmt=fmt, min_keyword_hit_rate=min_hit_rate,
                    record_baseline=record_baseline)
    doc = rec.model_dump(mode="json")

    def human() -> str:
        rows = [[c.id, "pass" if c.passed else "FAIL", str(c.prompt_tokens), str(c.output_tokens),
                 f"{c.latency_ms:.0f}", f"{c.keyword_hits}/{c.keyword_total}" if c.keyword_total else "-",
                 "; ".join(c.failures)] for c in rec.cases]
        head = (f"{'✓' if rec.passed else '✗'} {rec.name}@{rec.version} {rec.golden}: "
                f"{sum(c.passed for c in rec.cases)}/{len(rec.cases)} cases passed"
                + (f", keyword hit rate {rec.keyword_hit_rate:.2f}" if rec.keyword_hit_rate is not None else "")
                + f", p50 {rec.latency_p50_ms:.0f} ms, p95 {rec.latency_p95_ms:.0f} ms"
                + (f", {rec.tokens_per_s:g} tokens/s" if rec.tokens_per_s else "")
                + f" ({rec.runtime_version}; {rec.hardware})"
                + ("; baseline recorded" if record_baseline else ""))
        return head + "\n" + table(rows, ["CASE", "RESULT", "IN", "OUT", "MS", "KEYWORDS", "WHY"])

    Output(as_json).result(doc, human)
    if not rec.passed:
        err = CheckFailed(f"{rec.name}@{rec.version} failed golden set {rec.golden!r}",
                          hint="see the failing cases above; the record is kept, so promotion gates see it")
        Output(False).error(err)
        click.get_current_context().exit(err.exit_code)


def run() -> None:
    """Console entry point."""
    main(prog_name="mreg")


if __name__ == "__main__":  # pragma: no cover
    run()

