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


def settings_for(config_path: str | None, cache_dir: str | None = None, store: str | None = None) -> Any:
    from registry import config

    return config.load(config_path, cache_dir, store)


def local_store(settings: Any) -> Any:
    from registry.store import LocalStore

    location = settings.require_store()
    if location.startswith("s3://"):
        raise UsageError(f"this command works on a local store, not {location}",
                         hint="give a directory with --store; use `mreg push` / `mreg sync` to move versions")
    return LocalStore(Path(location))


def s3_store(url: str) -> Any:
    from registry.s3store import S3Store

    return S3Store(url, endpoint_url=click.get_current_context().meta.get("mreg.endpoint_url"))


def any_store(settings: Any) -> Any:
    location = settings.require_store()
    return s3_store(location) if location.startswith("s3://") else local_store(settings)


def progress_for(as_json: bool) -> BarProgress:
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
    s = settings_for(config_path, cache_dir, store)
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
                endpoint=endpoint, progress=progress_for(as_json))


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
    cache = settings_for(config_path, cache_dir).require_cache()
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


def _version_source(st: Any, source: str) -> Any:
    """The version a convert SOURCE names, when it is `NAME@REF` of a model in the store."""
    from registry.cache import local_source
    from registry.refs import is_name, parse_ref

    head = source.split("@", 1)[0]
    if "/" in head or local_source(source) is not None or not is_name(head) or not st.has_model(head):
        return None
    return st.resolve(parse_ref(source))


def _with_tensorrt_flags(targets: list[tuple[str, dict[str, Any]]], backend: str | None, target: str | None,
                         shapes: str | None, precision: str | None) -> list[tuple[str, dict[str, Any]]]:
    """Fold --backend/--target/--shapes/--precision into the spec of every `--to tensorrt` target."""
    tokens = [t for t in (
        f"backend={backend}" if backend else "",
        "target=" + "+".join(x.strip() for x in target.split(",") if x.strip()) if target else "",
        "shapes=" + ";".join(x.strip() for x in shapes.split(",") if x.strip()) if shapes else "",
        f"precision={precision}" if precision else "") if t]
    if not tokens:
        return targets
    if not any(fmt == "tensorrt" for fmt, _ in targets):
        raise UsageError("--backend, --target, --shapes and --precision go with --to tensorrt",
                         hint="add --to tensorrt, or drop those options")
    return [(fmt, {"spec": ",".join(filter(None, [opts.get("spec", ""), *tokens]))} if fmt == "tensorrt" else opts)
            for fmt, opts in targets]


def _parse_target(text: str) -> tuple[str, dict[str, Any]]:
    fmt, _, spec = text.partition(":")
    return fmt, ({"spec": spec} if spec else {})


@main.command()
@click.argument("source", metavar="REPO[@REVISION] | ./DIR | NAME@REF")
@click.option("--to", "targets", multiple=True, required=True, metavar="FORMAT[:SPEC]",
              help="Target format (repeatable): hf, gguf:TYPE (F16, Q8_0, Q4_K_M, …), onnx[:fp16,int8,optimize,"
                   "with-past], tensorrt[:target=sm_86+sm_89,…].")
@click.option("--name", help="Model name in the store (default for NAME@REF sources: the same model).")
@click.option("--copy", is_flag=True,
              help="Copy files into the store instead of hard-linking them from the cache.")
@click.option("--backend", type=click.Choice(["tensorrt-rtx", "tensorrt"]), help="TensorRT: the builder.")
@click.option("--target", "trt_target", metavar="sm_86,sm_89", help="TensorRT: compute capabilities, one engine each.")
@click.option("--shapes", metavar="NAME=MIN:OPT:MAX,...", help="TensorRT: profiles, e.g. input_ids=1x1:1x128:8x2048.")
@click.option("--precision", type=click.Choice(["fp32", "fp16"]), help="TensorRT: engine precision.")
@config_option
@cache_option
@store_option
@pull_options
@json_option
def convert(source: str, targets: tuple[str, ...], name: str | None, copy: bool, backend: str | None,
            trt_target: str | None, shapes: str | None, precision: str | None, config_path: str | None,
            cache_dir: str | None, store: str | None, include: tuple[str, ...], exclude: tuple[str, ...],
            allow_pickle: bool, offline: bool, endpoint: str | None, as_json: bool) -> None:
    """Convert a source (pulled into the cache first if needed) into a new, verified version.

    SOURCE is a hub repository, a local directory, or an existing version (NAME@REF): then the
    new version carries that version's artifacts (no copy) and adds the targets to them. The
    same conversion (same source bytes, converters, options, tool versions) run again returns
    the existing version without new work.
    """
    from registry.convert import check_targets
    from registry.convert import convert as run_convert

    # Bad targets or options are refused before any download.
    parsed = _with_tensorrt_flags([_parse_target(t) for t in targets], backend, trt_target, shapes, precision)
    check_targets(parsed)
    settings = settings_for(config_path, cache_dir, store)
    st = local_store(settings)
    cache = settings.require_cache()
    parent = _version_source(st, source)
    if parent is not None:
        src = parent.manifest.source
        if src.kind == "local":
            from registry.cache import load_record

            snap = load_record(cache, src.repo, src.commit)
            if snap is None:
                raise UsageError(f"the source of {parent.name}@{parent.number} ({src.requested_revision}) is no "
                                 f"longer in the cache {cache}", hint=f"run `mreg pull {src.requested_revision}`")
        else:
            snap = _do_pull(cache, f"{src.repo}@{src.commit}", include, exclude, allow_pickle, offline,
                            endpoint or src.endpoint, as_json)
        name = name or parent.name
    else:
        if not name:
            raise UsageError("--name is required when converting a repository or directory",
                             hint="e.g. --name qwen2.5-7b")
        snap = _do_pull(cache, source, include, exclude, allow_pickle, offline, endpoint, as_json)
    outcome = run_convert(st, snap, name, parsed, copy=copy, progress=progress_for(as_json), parent=parent)
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
    st = any_store(settings_for(config_path, store=store))
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

    st = any_store(settings_for(config_path, store=store))
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
    st = any_store(settings_for(config_path, store=store))
    entries = [e for e in st.history(name) if alias is None or e.alias == alias]
    docs = [e.model_dump(mode="json", by_alias=True) for e in entries]
    Output(as_json).result({"name": name, "entries": docs}, lambda: table(
        [[e.by.at.isoformat()[:19], e.alias, e.action, str(e.from_version or "-"), str(e.to_version),
          f"{e.by.user}@{e.by.host}", e.reason or ""] for e in entries],
        ["WHEN", "ALIAS", "ACTION", "FROM", "TO", "BY", "WHY"]) if entries else "(no alias changes)")


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

    st = any_store(settings_for(config_path, store=store))
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
    if fmt == "tensorrt":  # the plan that fits this machine's GPU, its recorded binding checked
        from converters.tensorrt_binding import pick_plan, resolve_plan

        if hasattr(st, "root"):
            plan = resolve_plan(f"{v.name}@{v.number}", art, Path(version_path))[0].relative_to(version_path)
        else:
            from converters.tensorrt_binding import detect_gpus

            plan = Path(pick_plan(f"{v.name}@{v.number}", art, detect_gpus())[0])
        path, version_path = f"{path}/{plan.as_posix()}", f"{version_path}/{plan.as_posix()}"
    else:  # the file an engine opens (the .gguf, model.onnx), or the directory for hf
        from registry.mount import engine_path

        main_file = engine_path(Path(), art).relative_to(art.path).as_posix()
        if main_file != ".":
            path, version_path = f"{path}/{main_file}", f"{version_path}/{main_file}"
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

    st = any_store(settings_for(config_path, store=store))
    if not refs and not all_:
        raise UsageError("nothing to verify", hint="give NAME@REF arguments or --all")
    versions = [st.resolve(parse_ref(r)) for r in refs]
    if all_:
        versions += [st.version(m, n) for m in st.models() for n in st.versions(m)]
    if hasattr(st, "root"):
        reports: list[Any] = [verify_version(st, v, progress_for(as_json)) for v in versions]
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

    st = any_store(settings_for(config_path, store=store))
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


#: Modules whose presence means thousands more were imported with them (torch and transformers: about 2,500).
HEAVY_MODULES = ("torch", "transformers", "onnxruntime", "tensorrt")


def run() -> None:
    """Console entry point.

    After a command that imported one of HEAVY_MODULES, Python's teardown of their modules takes
    about a second of the user's wall time once everything is done and printed. So the process ends
    there: exit handlers run and the streams are flushed first (every file mreg writes is closed and
    renamed into place before a command returns); what is skipped is the freeing of module objects
    and the joining of threads still running (a conversion's abandoned PyTorch reference, after an
    error or Ctrl-C).
    """
    try:
        main(prog_name="mreg")
    except SystemExit as done:
        if isinstance(done.code, int | None) and any(m in sys.modules for m in HEAVY_MODULES):
            _exit_now(done.code or 0)
        raise


def _exit_now(code: int) -> None:
    import atexit

    atexit._run_exitfuncs()
    for stream in {id(s): s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}.values():
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe: what was written is lost, as Python says with 120
            code = code or 120
    os._exit(code)


# The other command groups register themselves on `main` when imported.
from registry import cli_release, cli_remote  # noqa: E402

__all__ = ["cli_release", "cli_remote", "main", "run"]

if __name__ == "__main__":  # pragma: no cover
    run()

