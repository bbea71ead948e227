"""mreg's Python API: what the `mreg` command does, for pipelines (Airflow, Dagster, Kubeflow) without a subprocess.

Every function takes its store and cache explicitly, returns a typed result, never prints and
never exits; failures raise `registry.errors.MregError` subclasses carrying a hint and an exit
code. The CLI is this module plus parsing and rendering::

    from registry import api

    store = api.open_store("/srv/models")
    made = api.convert("Qwen/Qwen2.5-0.5B-Instruct", ["hf", "gguf:Q4_K_M"], name="qwen", store=store,
                       cache="/srv/cache")
    api.promote(store, f"qwen@{made.version.number}")
    print(api.resolve(store, "qwen@production", fmt="gguf").path)
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from registry import config
from registry.errors import IntegrityError, ModelNotFound, NotFound, UsageError
from registry.progress import Progress
from registry.refs import Ref, check_alias, check_name, parse_ref

if TYPE_CHECKING:  # the heavy parts are imported by the functions that use them
    import threading

    from manifests import CheckRecord, HistoryEntry, RolloutRecord, SignatureRecord
    from registry.cache import Snapshot
    from registry.convert.execute import ConversionOutcome
    from registry.convert.once import Waiting
    from registry.convert.plan import AnyTarget
    from registry.convert.protocol import Prepared
    from registry.fanout.matrix import Item, Matrix
    from registry.fanout.plan import PlannedItem
    from registry.oci.reference import LayoutRef, OciRef
    from registry.release.aliases import AliasChange
    from registry.release.hooks import HookedPromotion
    from registry.release.probes import Probing
    from registry.release.rollout import Outcome as RolloutOutcome
    from registry.serving.memory import MemoryPlan
    from registry.serving.mount import MountReport
    from registry.serving.triton import TritonExport
    from registry.source import Source
    from registry.store.gc import GCPlan
    from registry.store.local import LocalStore
    from registry.store.protocol import Store, Version
    from registry.store.s3 import S3Store
    from registry.store.signatures import SignatureResult
    from registry.store.transfer import PushOutcome, SyncOutcome
    from registry.store.transfer import Source as RemoteSource
    from registry.store.trust import TrustPolicy
    from registry.store.verify import VerifyReport


def settings(config_path: str | None = None, cache_dir: str | None = None, store: str | None = None) -> config.Settings:
    """Where the cache and the store are: the arguments, then MREG_CACHE_DIR / MREG_STORE, then the config file."""
    return config.load(config_path, cache_dir, store)


def open_store(location: str | Path, *, endpoint_url: str | None = None) -> LocalStore | S3Store:
    """A store: a directory, or `s3://bucket/prefix` (endpoint: `endpoint_url`, else $AWS_ENDPOINT_URL)."""
    text = str(location)
    if text.startswith("s3://"):
        return open_s3_store(text, endpoint_url=endpoint_url)
    return open_local_store(text)


def open_local_store(location: str | Path) -> LocalStore:
    """A store on this machine's filesystem; an s3:// location is a usage error."""
    from registry.store.local import LocalStore

    if str(location).startswith("s3://"):
        raise UsageError(f"this command works on a local store, not {location}",
                         hint="give a directory with --store; use `mreg push` / `mreg sync` to move versions")
    root = Path(location).expanduser()
    if root.exists() and not root.is_dir():
        raise UsageError(f"the store {root} is a file, not a directory", hint="give a directory with --store")
    return LocalStore(root)


def open_s3_store(url: str, *, endpoint_url: str | None = None) -> S3Store:
    """A store in S3 or an S3-compatible server."""
    from registry.store.s3 import S3Store

    return S3Store(url, endpoint_url=endpoint_url)


def pull(source: str, *, cache: str | Path, include: Sequence[str] = (), exclude: Sequence[str] = (),
         allow_pickle: bool = False, offline: bool = False, endpoint: str | None = None,
         progress: Progress | None = None, insecure: bool = False, copy: bool = False) -> Snapshot:
    """Bring `ORG/NAME[@REV]`, `./DIR`, `file:///DIR`, `oci://HOST/REPO:TAG|@DIGEST`, `oci-layout:DIR[:TAG]` or
    `oci-archive:FILE.tar[:TAG]` into the cache, every file verified; returns the snapshot. `insecure`: plain HTTP
    to a loopback registry. A local directory is hashed and linked in place (trusted while its files are
    unchanged), or copied into the cache with `copy`."""
    from registry import provenance
    from registry import source as sources

    provenance.user()  # a bad MREG_USER is refused before the download, not when the record is written
    fetch = sources.Fetch(Path(cache), tuple(include), tuple(exclude), allow_pickle, offline, endpoint, insecure, copy)
    return sources.parse(source, fetch).pull(progress)


def prepare_targets(targets: Sequence[AnyTarget]) -> list[Prepared]:
    """Each target (`"gguf:Q4_K_M"`, `("hf", {})`, a converter's typed options such as
    `GGUFOptions(type="Q4_K_M", imatrix="a,b.dat")`) checked and normalized, the files it names read once.
    `convert` takes the result as it is: nothing is checked or read twice."""
    from registry.convert.plan import prepare

    return prepare(targets)


def check_targets(targets: Sequence[AnyTarget]) -> None:
    """Refuse unknown formats, bad options and repeats, cheaply and before any download."""
    prepare_targets(targets)


def version_source(store: LocalStore, source: str) -> Version | None:
    """The version a convert SOURCE names when it is `NAME@REF` of a model in the store, else None."""
    from registry import source as sources

    return _version(store, sources.parse(source, sources.Fetch(Path("."))))


def _version(store: LocalStore, src: Source) -> Version | None:
    """The version a parsed SOURCE names when it is `NAME[@REF]` of a model in the store."""
    return store.resolve(parse_ref(src.text)) if src.model is not None and store.has_model(src.model) else None


def convert(source: str, targets: Sequence[AnyTarget], *, store: LocalStore | S3Store,
            cache: str | Path, name: str | None = None, copy: bool = False, include: Sequence[str] = (),
            exclude: Sequence[str] = (), allow_pickle: bool = False, offline: bool = False,
            endpoint: str | None = None, progress: Progress | None = None,
            on_pull: Callable[[], None] | None = None, insecure: bool = False, wait: bool = True,
            on_wait: Callable[[Waiting], None] | None = None) -> ConversionOutcome:
    """Convert a source into a new verified version of `name` (or find the same conversion's version).

    SOURCE is a hub repository, a local directory, or `NAME@REF` of a version in the store: the
    new version then carries that version's artifacts and adds the targets. `on_pull` runs just
    before anything is fetched (the CLI quiets huggingface_hub's bars there). `copy`: copies, never
    links: a local directory into the cache, the cache's files into the store. The store may be an
    S3 store: the version is built on this machine, then pushed. While another run (here or on another
    machine) does the same conversion, this one waits for its version (`on_wait` is told who holds it),
    or with `wait=False` raises LeaseHeld (exit 5).
    """
    from registry import provenance
    from registry import source as sources
    from registry.cache import load_record
    from registry.convert.execute import convert as run
    from registry.store.local import LocalStore as Local

    provenance.user()  # a bad MREG_USER is refused before any work, not when the manifest is written
    parsed = prepare_targets(targets)
    fetch = sources.Fetch(Path(cache), tuple(include), tuple(exclude), allow_pickle, offline, endpoint, insecure, copy)
    src = sources.parse(source, fetch)
    parent = _version(store, src) if isinstance(store, Local) else None
    if not isinstance(store, Local) and "@" in source and src.model is not None and store.has_model(src.model):
        raise UsageError(f"{source}: converting a version of an S3 store into it is not supported",
                         hint="convert from the version's source (a repository or directory), or in a local "
                              "store, then `mreg push`")
    fetching = on_pull or (lambda: None)
    config = None  # the source's config.json, once read
    if parent is not None:
        origin = parent.manifest.source
        if origin.kind in ("local", "oci"):
            snap = load_record(Path(cache), origin.repo, origin.commit)
            if snap is None:
                raise UsageError(f"the source of {parent.name}@{parent.number} ({origin.requested_revision}) is no "
                                 f"longer in the cache {cache}, or its directory changed since it was imported",
                                 hint=f"run `mreg pull {origin.requested_revision}`")
        else:
            fetching()
            snap = sources.HubSource(f"{origin.repo}@{origin.commit}", origin.repo, origin.commit,
                                     replace(fetch, endpoint=endpoint or origin.endpoint)).pull(progress)
        name = name or parent.name
    else:
        if not name:
            raise UsageError("--name is required when converting a repository or directory",
                             hint="e.g. --name qwen2.5-7b")
        fetching()
        config = _refuse_early(src, parsed)
        snap = src.pull(progress)
    return run(store, snap, name, parsed, copy=copy, progress=progress, parent=parent, wait=wait, on_wait=on_wait,
               config=config)


def load_matrix(path: str | Path) -> Matrix:
    """A conversion matrix file, validated and expanded into numbered items (see registry.fanout.matrix)."""
    from registry.fanout.matrix import load

    return load(Path(path))


def matrix_item(matrix: Matrix, item: int, among: Sequence[int] | None = None) -> Item:
    """The item `--item N` names (with `among`: the Nth of those items, as a Kubernetes Indexed Job reaches it)."""
    from registry.fanout.matrix import pick

    return pick(matrix, item, list(among) if among is not None else None)


def plan_matrix(matrix: Matrix, *, store: Store, cache: str | Path, offline: bool = False,
                endpoint: str | None = None) -> list[PlannedItem]:
    """Every item of a matrix with its conversion key and the store's version for it (no weights downloaded)."""
    from registry.fanout.plan import plan

    return plan(matrix, store, Path(cache), offline=offline, endpoint=endpoint)


def _refuse_early(src: Source, targets: Sequence[Prepared]) -> dict[str, Any] | None:
    """Let each target's converter (and what it needs) refuse the model from the source's config alone, before
    any weight is downloaded (a hub repository's config.json is fetched alone first); the config, as read."""
    from registry.convert.formats import get

    config = src.config()
    if config is not None:
        formats = {t.format for t in targets}
        for t in targets:
            get(t.format).check_config(config, t.options)
        for need in sorted({need for fmt in formats for need in get(fmt).needs} - formats):
            get(need).check_config(config)
    return config


def promote(store: Store, ref: str, *, alias: str = "production", expect: int | str | None = "",
            reason: str | None = None, require: Sequence[str] = (), force: bool = False,
            policy: dict[str, Any] | None = None, reload_cmd: str | None = None, reload_url: str | None = None,
            ready_url: str | None = None, ready_cmd: str | None = None,
            ready_timeout_s: float | None = None, trust: TrustPolicy | None = None) -> HookedPromotion:
    """Point `alias` at the version `ref` names (atomic flip, recorded), after the gates; then the engine hooks.

    `policy` is the config file's contents: its `[models.NAME]` hooks and requirements apply; the
    hook arguments override them and `require` adds to them. `expect` is the version the alias
    must point to now (None: the alias must not exist yet; "": no condition). If the engine is not
    ready after the flip, the alias is flipped back and `EngineNotReady` raised. `trust` is the
    policy a `signature` requirement is judged by (default: the one in `policy`, paths relative to
    the working directory; `trust_policy` reads them relative to the config file).
    """
    from registry.release import hooks
    from registry.store.trust import policy_for

    r = parse_ref(ref)
    if trust is None:
        trust = policy_for(policy or {}, r.name, Path.cwd())
    configured_hooks, configured = hooks.model_policy(policy or {}, r.name)
    merged = hooks.merge(configured_hooks, reload_cmd=reload_cmd, reload_url=reload_url, ready_url=ready_url,
                         ready_cmd=ready_cmd, ready_timeout_s=ready_timeout_s)
    version = store.resolve(r)
    if force:  # an alias under a staged rollout: --force aborts the rollout first
        from registry.release.rollout import abort_for

        hooks.check(merged)  # nothing is aborted for a promotion whose settings could only fail
        abort_for(store, r.name, alias, "promote")
    return hooks.promote_with_hooks(store, r.name, version, merged, alias=alias, expect=expect,
                                    reason=reason, force=force, require=(*configured, *require), trust=trust)


def aliases_at(store: Store, name: str, at: str | dt.datetime, *, alias: str | None = None
               ) -> dict[str, HistoryEntry]:
    """Which version every alias of `name` (or only `alias`) pointed to at time `at` (ISO 8601 text or a datetime;
    naive is UTC), as the history entry that set it; an alias made later is absent."""
    from registry.release.aliases import aliases_at as replay
    from registry.release.aliases import parse_time

    check_name(name)
    if not store.has_model(name):
        raise ModelNotFound(name)
    when = parse_time(at) if isinstance(at, str) else at if at.tzinfo else at.replace(tzinfo=dt.timezone.utc)
    return {a: e for a, e in replay(store.history(name), when).items() if alias is None or a == alias}


def rollback(store: Store, name: str, *, alias: str = "production", to: int | None = None,
             expect: int | str | None = "", reason: str | None = None, force: bool = False) -> AliasChange:
    """Move an alias back to where it pointed before (or to `to`); successive rollbacks walk further back.
    An alias under a staged rollout is refused (exit 5) unless `force`, which aborts the rollout first."""
    from registry.release.aliases import rollback as run

    if force:
        from registry.release.rollout import abort_for

        abort_for(store, name, alias, "rollback")
    return run(store, name, alias=alias, to=to, expect=expect, reason=reason)


def rollout_start(store: Store, ref: str, *, alias: str = "production", steps: str | Sequence[int] | None = None,
                  interval: str | float | None = None, gates: Sequence[str] = (), apply: str | None = None,
                  apply_target: str | None = None, expect: int | str | None = "", reason: str | None = None,
                  require: Sequence[str] = (),
                  force: bool = False, policy: dict[str, Any] | None = None,
                  trust: TrustPolicy | None = None) -> RolloutOutcome:
    """Start a staged rollout of the version `ref` names against the version `alias` points at now.

    `policy` is the config file's contents: `[models.NAME.rollout]` may give steps, interval, gates, apply and
    apply_target (arguments override them; gates add to them) and `[models.NAME]` require adds requirements.
    Everything is checked before anything is written; the canary alias `<alias>-canary` then leads to the version.
    """
    from registry.release import hooks, rollout
    from registry.store.trust import policy_for

    r = parse_ref(ref)
    if trust is None:
        trust = policy_for(policy or {}, r.name, Path.cwd())
    _hooks, configured = hooks.model_policy(policy or {}, r.name)
    conf = rollout.configured(policy or {}, r.name)
    chosen = steps if steps is not None else conf.get("steps")
    if chosen is None:
        raise UsageError("no --steps given", hint="e.g. --steps 5,25,50,100, or steps = [5, 25, 100] under "
                                                  f"[models.{r.name}.rollout] in the config file")
    p = rollout.plan(chosen, interval if interval is not None else conf.get("interval", 0.0),
                     (*conf.get("gates", ()), *gates), apply if apply is not None else conf.get("apply"),
                     apply_target if apply_target is not None else conf.get("apply_target"))
    return rollout.start(store, r.name, store.resolve(r), p, alias=alias, expect=expect, reason=reason,
                         require=(*configured, *require), trust=trust, force=force)


def rollout_status(store: Store, name: str, *, alias: str = "production") -> RolloutRecord | None:
    """The alias's rollout record (running, paused, or the last one that ended); None when it never had one."""
    from registry.release import rollout

    return rollout.status(store, name, alias)


def rollout_advance(store: Store, name: str, *, alias: str = "production", reason: str | None = None,
                    probing: Probing | None = None) -> RolloutOutcome:
    """The next step now, its gates checked first (a failing gate aborts: RolloutAborted, exit 10)."""
    from registry.release import rollout

    return rollout.advance(store, name, alias, probing=probing, reason=reason)


def rollout_pause(store: Store, name: str, *, alias: str = "production", reason: str | None = None
                  ) -> RolloutOutcome:
    """Hold a rollout at its weight."""
    from registry.release import rollout

    return rollout.pause(store, name, alias, reason)


def rollout_resume(store: Store, name: str, *, alias: str = "production", reason: str | None = None
                   ) -> RolloutOutcome:
    """Let a paused rollout go on."""
    from registry.release import rollout

    return rollout.resume(store, name, alias, reason)


def rollout_abort(store: Store, name: str, *, alias: str = "production", reason: str | None = None
                  ) -> RolloutOutcome:
    """The canary's weight back to 0 and the canary alias removed; the stable alias untouched."""
    from registry.release import rollout

    return rollout.abort(store, name, alias, reason)


def rollout_run(store: Store, name: str, *, alias: str = "production", probing: Probing | None = None,
                on_step: Callable[[RolloutOutcome], None] | None = None) -> RolloutOutcome:
    """Drive every remaining step until the alias flips or a gate fails (RolloutAborted, exit 10)."""
    from registry.release import rollout

    return rollout.run(store, name, alias, probing=probing, on_step=on_step)


def rollout_render(store: Store, name: str, target: str, *, alias: str = "production", port: int = 8080,
                   stable_addr: str = "stable:8080", canary_addr: str = "canary:8080"
                   ) -> str | list[dict[str, Any]] | dict[str, Any]:
    """What router `target` needs for the rollout's current step (Kubernetes resources, a document, or text)."""
    from registry.release import rollout, routers

    rec = rollout.status(store, name, alias)
    if rec is None:
        raise NotFound(f"{name} {alias} has no rollout", hint=f"start one with `mreg rollout start {name}@VERSION`")
    return routers.render(store, rec, target, port=port, stable_addr=stable_addr, canary_addr=canary_addr)


@dataclass(frozen=True)
class Resolved:
    """What a serving engine reads for one artifact of a version."""

    name: str
    version: int
    format: str
    #: The alias path (it follows flips) for an alias of a local store, else the version's path.
    path: str
    version_path: str
    alias: str | None


def resolve(store: Store, ref: str, *, fmt: str = "hf", physical: bool = False) -> Resolved:
    """The path to mount for a version's artifact: its main file (or directory), the TensorRT plan for this GPU."""
    from registry.convert import formats

    r = parse_ref(ref, default="production")
    v = store.resolve(r)
    art = next((a for a in v.manifest.artifacts if a.format == fmt), None)
    if art is None:
        have = ", ".join(a.format for a in v.manifest.artifacts)
        raise NotFound(f"{v.name}@{v.number} has no {fmt} artifact (it has {have})",
                       hint=f"run `mreg convert ... --to {fmt} --name {v.name}`")
    is_alias = r.number is None and store.alias(r.name, r.ref) is not None
    version_path = f"{v.path}/{art.path}"
    mount = store.alias_mount(v.name, r.ref) if is_alias and not physical else None
    path = f"{mount}/{art.path}" if mount else version_path  # remote stores: the version (mount it with sync)
    files = store.files_dir(v)
    main = formats.get(fmt).engine_file(f"{v.name}@{v.number}", art, files / art.path if files else None)
    if main != ".":
        path, version_path = f"{path}/{main}", f"{version_path}/{main}"
    return Resolved(v.name, v.number, fmt, path, version_path, r.ref if is_alias else None)


def serving_memory(store: Store, ref: str, memory_gib: float, *, context: int | None = None,
                   cache_type: str = "f16", utilization: float = 0.9, reserve_gib: float = 1.0) -> MemoryPlan:
    """How many sequences of `context` tokens a version serves in `memory_gib` GiB, from its manifest alone."""
    from registry.serving import memory

    v = store.resolve(parse_ref(ref))
    return memory.plan(v.manifest, memory_gib, context=context, cache_type=cache_type, utilization=utilization,
                       reserve_gib=reserve_gib)


@dataclass(frozen=True)
class ModelSummary:
    """One model of a store, as `mreg list` shows it: its good versions and its aliases."""

    name: str
    versions: tuple[int, ...]
    aliases: dict[str, int]


@dataclass(frozen=True)
class StoreListing:
    """The models of a store, and every entry met on the way that mreg did not write (`problems`)."""

    location: str
    models: tuple[ModelSummary, ...]
    problems: tuple[IntegrityError, ...]


@dataclass(frozen=True)
class VersionListing:
    """The versions of one model, its aliases, and every entry or version that could not be read (`problems`)."""

    name: str
    versions: tuple[Version, ...]
    aliases: dict[str, int]
    problems: tuple[IntegrityError, ...]


def list_models(store: Store) -> StoreListing:
    """Every model of the store with its versions and aliases (`mreg list`); what is not mreg's is named, not fatal."""
    _check_is_store(store)
    problems: list[IntegrityError] = []
    models = tuple(ModelSummary(m, *_surveyed(store, m, problems)) for m in store.models())
    return StoreListing(store.location, models, tuple(problems))


def list_versions(store: Store, name: str) -> VersionListing:
    """Every version of one model (`mreg list NAME`); one that cannot be read is among the problems, not fatal."""
    _check_is_store(store)
    check_name(name)
    if name not in store.models():
        raise ModelNotFound(name)
    problems: list[IntegrityError] = []
    numbers, aliases = _surveyed(store, name, problems)
    versions: list[Version] = []
    for n in numbers:
        try:
            versions.append(store.version(name, n))
        except IntegrityError as e:  # named among the problems; the other versions are still listed
            problems.append(e)
    return VersionListing(name, tuple(versions), aliases, tuple(problems))


def _check_is_store(store: Store) -> None:
    """Refuse a location that holds no store (exit 3): listing it would read as an empty store."""
    if not store.is_store():
        raise NotFound(f"there is no store at {store.location}",
                       hint="check --store / MREG_STORE (`mreg config` shows which is used); "
                            "`mreg convert` creates a store")


def _surveyed(store: Store, name: str, problems: list[IntegrityError]) -> tuple[tuple[int, ...], dict[str, int]]:
    """A model's good versions and aliases; what is not mreg's (or cannot be read) goes to `problems`."""
    numbers, strays = store.survey(name)
    problems += strays
    try:
        aliases = store.aliases(name)
    except IntegrityError as e:  # a bad alias: already among the strays of a local store
        aliases = {}
        if str(e) not in {str(p) for p in problems}:
            problems.append(e)
    return tuple(numbers), aliases


@dataclass(frozen=True)
class VersionDetails:
    """A version as `mreg show` tells it: the version, the aliases that point at it, its signatures judged."""

    version: Version
    aliases: tuple[str, ...]
    #: Each signature judged against the trust policy (`registry.store.signatures.shown`), as documents.
    signatures: list[dict[str, Any]]


def show(store: Store, ref: str, *, trust: TrustPolicy | Callable[[str], TrustPolicy] | None = None
         ) -> VersionDetails:
    """The version `ref` names (number, alias, `latest` or manifest digest prefix), its aliases and signatures.

    `trust` judges the signatures: a policy, or a function from the model's name to its policy
    (`lambda n: trust_policy(settings, n)`); without one every signature is untrusted.
    """
    from registry.store.signatures import shown
    from registry.store.trust import TrustPolicy as Policy

    v = store.resolve(parse_ref(ref))
    aliases = tuple(sorted(a for a, n in store.aliases(v.name).items() if n == v.number))
    policy = trust(v.name) if callable(trust) else trust if trust is not None else Policy()
    return VersionDetails(v, aliases, shown(store, v, policy))


def history(store: Store, name: str, *, alias: str | None = None) -> list[HistoryEntry]:
    """Every alias change of a model, oldest first (only `alias`'s with one): who, when, from, to, why."""
    check_name(name)
    if not store.has_model(name):
        raise ModelNotFound(name)  # as `show` says: a model that is not there has no history either
    return [e for e in store.history(name) if alias is None or e.alias == alias]


def mount_check(store: LocalStore, name: str, *, alias: str = "production", mount_root: str | None = None,
                verify: bool = False) -> MountReport:
    """Check one alias of a model against the mount contract (see `registry.serving.mount`): a report, whose
    `escapes` (links out of their place) and `damaged` files (with `verify`: every file re-hashed) are apart."""
    from registry.serving.mount import mount_check as run

    check_name(name)
    check_alias(alias)
    return run(store, name, alias, mount_root=mount_root, verify=verify)


def export_triton(store: LocalStore, ref: str, repo: str | Path, *, max_batch_size: int = 8,
                  prefer: str = "auto") -> TritonExport:
    """Write a Triton model repository entry for a version (links into the store, config.pbtxt, one rename);
    `prefer`: `onnx`, `tensorrt` or `auto` (the TensorRT plans when the version has them)."""
    from registry.serving import triton

    return triton.export(store.resolve(parse_ref(ref)), Path(repo), max_batch_size=max_batch_size, prefer=prefer)


def verify(store: Store, refs: Sequence[str] = (), *, all_versions: bool = False,
           progress: Progress | None = None) -> list[VerifyReport]:
    """Re-hash every file of these versions (local) or every blob (S3); a report per version."""
    from registry.store.verify import VerifyReport
    from registry.store.verify import verify as run

    if not refs and not all_versions:
        raise UsageError("nothing to verify", hint="give NAME@REF arguments or --all")
    versions = [_readable(store, parse_ref(r)) for r in refs]
    if all_versions:  # every good version, even beside entries mreg did not write (`strays` names those)
        versions += [_readable(store, Ref(m, str(n))) for m in store.models() for n in store.survey(m)[0]]
    return [v if isinstance(v, VerifyReport) else run(store, v, progress) for v in versions]


def strays(store: Store) -> list[IntegrityError]:
    """Every entry of the store's models that mreg did not write there (a `versions/01`, a file where a version's
    directory belongs, a directory where an alias does), each named: what `list` and `verify --all` report."""
    return [e for m in store.models() for e in store.survey(m)[1]]


def _readable(store: Store, ref: Ref) -> Version | VerifyReport:
    """The version a reference names or, when reading it already fails an integrity check, its failed report."""
    from registry.store.verify import unreadable

    try:
        return store.resolve(ref)
    except IntegrityError as e:  # a report, not a crash: `verify --all` still checks every other version
        number = ref.number if ref.number is not None else store.alias(ref.name, ref.ref)
        if number is None:
            raise
        return unreadable(ref.name, number, e)


def gc(store: Store, *, keep_history: int = 10, keep_latest: int = 3, grace_hours: float = 24.0,
       apply: bool = False) -> GCPlan:
    """What nothing needs any more (a plan), removed when `apply`: versions, blobs, interrupted writes, leases."""
    import math

    from registry.store.gc import collect

    for flag, count in (("--keep-history", keep_history), ("--keep-latest", keep_latest)):
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise UsageError(f"{flag} must be a whole number of 0 or more, not {count!r}",
                             hint=f"e.g. {flag} 3 (0 keeps none for this reason; aliases are always kept)")
    if isinstance(grace_hours, bool) or not isinstance(grace_hours, (int, float)) or not math.isfinite(grace_hours) \
            or grace_hours < 0:
        raise UsageError(f"--grace-hours must be a number of hours of 0 or more, not {grace_hours!r}",
                         hint="e.g. --grace-hours 24 (uploads in flight younger than this are kept)")
    return collect(store, keep_history=keep_history, keep_latest=keep_latest, grace_s=grace_hours * 3600,
                   apply=apply)


def open_remote(location: str | S3Store, *, endpoint_url: str | None = None) -> S3Store | OciRef | LayoutRef:
    """Where a push goes or a sync reads from, parsed in one place: `s3://BUCKET/PREFIX` (an S3 store; endpoint:
    `endpoint_url`, else $AWS_ENDPOINT_URL), `oci://HOST/REPO[:TAG|@DIGEST]`, `oci-layout:DIR[:TAG]` or
    `oci-archive:FILE.tar[:TAG]`; an S3 store already open passes through."""
    from registry.oci import reference

    if not isinstance(location, str):
        return location
    if reference.is_oci(location):
        return reference.parse(location)
    if location.startswith("s3://"):
        return open_s3_store(location, endpoint_url=endpoint_url)
    raise UsageError(f"{location} is not a remote",
                     hint="give s3://BUCKET/PREFIX, oci://HOST/REPO[:TAG], oci-layout:DIR[:TAG] or "
                          "oci-archive:FILE.tar[:TAG]")


def push(store: LocalStore, version: str | Version, remote: str | S3Store, *, progress: Progress | None = None,
         endpoint_url: str | None = None, verify_remote: bool = False, force: bool = False, insecure: bool = False,
         chunk: int | None = None, as_image: bool = False, base: str | None = None,
         stop: threading.Event | None = None) -> PushOutcome:
    """Copy a local version (a reference or a resolved `Version`) to a remote (`open_remote`): only the blobs it
    lacks, the manifest last.

    To S3 the manifest is written create-only, which gives the version its number there; with `verify_remote`,
    remote blobs that fail their digest are sent again. To OCI the version becomes a ModelPack artifact, or with
    `as_image` a regular image, over the image `base` when given (tag `N`, or `N-image` for an image, by default);
    a tag naming another digest is refused unless `force`. A chunked upload (`chunk` bytes) a killed push left is
    resumed (sessions under the store's tmp/, `registry.oci.uploads`); with `stop` set (the CLI sets it on
    SIGINT/SIGTERM) a push to a registry ends at the next chunk boundary, resumable (`Interrupted`). `insecure`:
    plain HTTP to a loopback registry. An option for the other kind of remote is a UsageError."""
    from registry.oci import reference

    v = store.resolve(parse_ref(version)) if isinstance(version, str) else version
    where = open_remote(remote, endpoint_url=endpoint_url)
    if isinstance(where, (reference.OciRef, reference.LayoutRef)):
        if verify_remote:
            raise UsageError("--verify-remote is for S3 stores", hint="a registry checks each blob's digest itself")
        return _push_oci(store, v, where, force=force, insecure=insecure, progress=progress, chunk=chunk,
                         as_image=as_image, base=base, stop=stop)
    from registry.store.s3_transfer import S3Sink
    from registry.store.transfer import push as run

    given = [flag for flag, on in (("--force", force), ("--chunk", chunk is not None), ("--as-image", as_image),
                                   ("--base", base is not None)) if on]
    if given:
        raise UsageError(f"{', '.join(given)}: for OCI destinations (oci://, oci-layout:, oci-archive:), not "
                         f"{where.location}", hint="an S3 push numbers the version there; it has no tag to move")
    return run(S3Sink(where, verify_remote=verify_remote), store, v, progress=progress)


def _push_oci(store: LocalStore, v: Version, ref: OciRef | LayoutRef, *, force: bool, insecure: bool,
              progress: Progress | None, chunk: int | None, as_image: bool, base: str | None,
              stop: threading.Event | None) -> PushOutcome:
    from registry import layout
    from registry.oci import reference, transfer
    from registry.oci.base import read_base
    from registry.store.transfer import push as run

    if base is not None and not as_image:
        raise UsageError("--base is for --as-image", hint="add --as-image, or drop --base")
    if ref.digest:
        raise UsageError(f"push to a tag, not a digest: {ref}", hint="e.g. oci://HOST/REPO:v1")
    base_ref = reference.parse(base) if base is not None else None
    loopback = isinstance(base_ref, reference.OciRef) and base_ref.is_loopback  # --insecure is for loopback only
    below = transfer.open_target(base_ref, insecure=insecure and loopback, images=False) \
        if base_ref is not None else None
    try:
        image = read_base(below, base_ref.digest or base_ref.tag, str(base_ref),
                          base_ref.image_name if isinstance(base_ref, reference.OciRef) else None) \
            if below is not None and base_ref is not None else None
        target = transfer.open_target(ref, insecure=insecure, create=True, chunk=chunk,
                                      sessions=layout.oci_uploads_dir(store.root), stop=stop)
        try:
            tag = ref.tag or (f"{v.number}-image" if as_image else str(v.number))
            sink = transfer.OciSink.of(store, v, target, tag, force=force, progress=progress, as_image=as_image,
                                       base=image)
            return run(sink, store, v, progress=progress)
        finally:
            transfer.close_target(target)
    finally:
        if below is not None:
            transfer.close_target(below)


def sync(store: LocalStore, remote: str | S3Store, name: str | None = None, *, alias: str = "production",
         progress: Progress | None = None, trust: TrustPolicy | Callable[[str], TrustPolicy] | None = None,
         insecure: bool = False, endpoint_url: str | None = None) -> SyncOutcome:
    """Materialize the version a remote (`open_remote`) names in the local store, every blob verified, under its
    number, then flip the local `alias` to it; its signature records are kept beside it.

    From S3 it is the version of the remote's alias `alias` of model `name` (required), and the canary beside
    it while a rollout runs; from OCI, the mreg version the artifact carries (`name`, when given, must be its
    model). `trust` is a policy, or a function from the model's name to its policy (`lambda n:
    trust_policy(settings, n)`); under one that is not empty, only a version one of whose signatures verifies is
    synced (else `GateRefused`, before any blob is downloaded)."""
    from registry.store.transfer import sync as run

    return run(_source(remote, name, alias, insecure=insecure, endpoint_url=endpoint_url), store, alias,
               progress=progress, trust=_by_name(trust))


def watch(store: LocalStore, remote: str | S3Store, name: str, *, alias: str = "production", every: float,
          on_change: Callable[[SyncOutcome], None], stop: threading.Event, on_error: Callable[[Exception], None],
          trust: TrustPolicy | Callable[[str], TrustPolicy] | None = None, endpoint_url: str | None = None) -> None:
    """Keep syncing an S3 alias every `every` seconds until `stop` is set (each round under the trust policy); a
    round that finds the alias as the last one left it reads nothing more."""
    from registry.store.transfer import watch as run

    source = _source(remote, name, alias, insecure=False, endpoint_url=endpoint_url)
    if not source.aliases:
        raise UsageError("--watch follows S3 aliases; an OCI tag is not an alias", hint="sync the tag when it moves")
    run(source, store, alias, every, on_change, stop, on_error, _by_name(trust))


def _source(remote: str | S3Store, name: str | None, alias: str, *, insecure: bool,
            endpoint_url: str | None) -> RemoteSource:
    """What a sync reads: an S3 store's alias, or an OCI artifact."""
    from registry.oci import reference, transfer
    from registry.store.s3_transfer import S3Source

    if name is not None:
        check_name(name)
    check_alias(alias)
    where = open_remote(remote, endpoint_url=endpoint_url)
    if isinstance(where, (reference.OciRef, reference.LayoutRef)):
        return transfer.OciSource(transfer.open_target(where, insecure=insecure), where.digest or where.tag, name)
    if name is None:
        raise UsageError("NAME is required when syncing from S3", hint=f"e.g. mreg sync {where.location} NAME")
    return S3Source(where, name, alias)


def _by_name(trust: TrustPolicy | Callable[[str], TrustPolicy] | None) -> Callable[[str], TrustPolicy] | None:
    """A trust policy as a sync takes it: by the model's name (which an OCI artifact tells only once read)."""
    if trust is None or callable(trust):
        return trust
    policy = trust
    return lambda _name: policy


def check(store: LocalStore, ref: str, golden: str | Path, *, fmt: str | None = None, min_hit_rate: float = 1.0,
          record_baseline: bool = False) -> CheckRecord:
    """Run a golden set through a version's artifact and keep the record (promotion gates read it)."""
    from registry.release.check import load_golden, run_check

    v = store.resolve(parse_ref(ref))
    return run_check(store, v, load_golden(Path(golden)), fmt=fmt, min_keyword_hit_rate=min_hit_rate,
                     record_baseline=record_baseline)


def trust_policy(settings: config.Settings, name: str) -> TrustPolicy:
    """The trust policy for a model: `[models.NAME.trust]`, else `[trust]`, paths relative to the config file."""
    from registry.store.trust import policy_for

    return policy_for(settings.raw, name, settings.config_path.parent)


def sign(store: LocalStore, ref: str, *, key: str | Path | None = None, certificate: str | Path | None = None,
         chain: Sequence[str | Path] = (), password: str | None = None, signer: str | None = None,
         import_bundle: str | Path | None = None) -> SignatureRecord:
    """Sign a version (its manifest's files and the manifest) with an EC key, or a key and its certificate chain;
    or keep a bundle the model_signing CLI made on the version directory. The record is kept beside the version."""
    from registry.inputs import check_input
    from registry.store import signatures

    # model-signing opens these itself: each a regular file of sane size first (/dev/zero would be read forever).
    # PEM keys and certificates are a few KiB; a bundle lists one digest per file of the version.
    for flag, given, limit in (("--key", [key], 1 << 20), ("--certificate", [certificate], 1 << 20),
                               ("--chain", list(chain), 1 << 20), ("--import", [import_bundle], 64 << 20)):
        for path in (p for p in given if p is not None):
            check_input(path, flag, limit=limit, hint=f"give {flag} a PEM file (a bundle for --import)")
    v = store.resolve(parse_ref(ref))
    if import_bundle is not None:
        if key is not None or certificate is not None:
            raise UsageError("--import takes no key or certificate", hint="the bundle carries its own")
        return signatures.import_bundle(store, v, Path(import_bundle), signer)
    if key is None:
        raise UsageError("nothing to sign with", hint="pass --key KEY.pem (and --certificate CERT.pem), or --import")
    if chain and certificate is None:
        raise UsageError("--chain needs --certificate", hint="pass the signing certificate with --certificate")
    if password is not None and certificate is not None:
        raise UsageError("model-signing 1.1 reads a certificate's key without a password",
                         hint="sign with an unencrypted key file (e.g. on a tmpfs), or with --key alone")
    return signatures.sign(store, v, key=Path(key), certificate=Path(certificate) if certificate else None,
                           chain=[Path(c) for c in chain], password=password, signer=signer)


def verify_signatures(store: Store, version: Version, trust: TrustPolicy, *, rehash: bool = True
                      ) -> list[SignatureResult]:
    """Judge every signature of a version against a trust policy (on a local store, against the bytes too)."""
    from registry.store.signatures import judge

    files = store.files_dir(version) if rehash else None
    return [judge(r, version, trust, files) for r in store.signatures(version.name, version.number)]
