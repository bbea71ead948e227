"""What each page shows, as JSON-ready documents: the pages' JSON twins, and what the templates render.

Every read of one item (a model's aliases, its history, one manifest, a version's check or signature records)
is caught on its own: a damaged item becomes a `problem` in the document (type, message, hint) and the rest of
the page is still shown. The documents reuse the CLI's own: a history entry as `mreg history --json` writes it,
a version as `mreg show --json` (and `show --memory`) does, the aliases at a time as `mreg history --at`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from registry.errors import MregError

if TYPE_CHECKING:
    from manifests import HistoryEntry, Manifest
    from registry.store.protocol import Store, Version
    from registry.store.trust import TrustPolicy

#: What reading one damaged item can raise: mreg's integrity errors, and a record that does not parse (pydantic's
#: ValidationError is a ValueError) or cannot be read.
ItemError = (MregError, OSError, ValueError)
#: The device memory the version page's serving figures assume until the reader asks for another.
DEFAULT_MEMORY_GIB = 80.0


def problem_doc(err: BaseException) -> dict[str, Any]:
    """A damaged item's error, as the page shows it."""
    return {"type": type(err).__name__, "message": str(err).splitlines()[0] if str(err) else type(err).__name__,
            "hint": getattr(err, "hint", None)}


class Problems:
    """The problems met while building one document: `with problems.item(): ...` keeps going past a damaged item."""

    def __init__(self) -> None:
        self.docs: list[dict[str, Any]] = []

    @contextmanager
    def item(self, what: str) -> Iterator[None]:
        """Run the block; a damaged item's error is recorded (naming `what`) instead of raised."""
        try:
            yield
        except ItemError as e:
            self.docs.append({"item": what, **problem_doc(e)})


class Reader:
    """The store as the pages read it: versions read once per reader (a site build reads each manifest once; the
    server makes a reader per request, so that a page always shows the store as it is)."""

    def __init__(self, store: Store, trust: Callable[[str], TrustPolicy]) -> None:
        self.store = store
        self.trust = trust
        self._versions: dict[tuple[str, int], Version] = {}

    def version(self, name: str, number: int) -> Version:
        """One version (read once)."""
        key = (name, number)
        if key not in self._versions:
            self._versions[key] = self.store.version(name, number)
        return self._versions[key]


def entry_doc(e: HistoryEntry) -> dict[str, Any]:
    """A history entry as `mreg history --json` writes it."""
    doc: dict[str, Any] = e.model_dump(mode="json", by_alias=True)
    return doc


def aliases_at_doc(name: str, at: dt.datetime, state: dict[str, HistoryEntry]) -> dict[str, Any]:
    """`mreg history NAME --at TIME --json` and the "as of" answer of the model page: each alias, its version and
    the entry that set it."""
    return {"name": name, "at": at.isoformat(), "aliases": {
        a: {"version": e.to_version, "since": e.by.at.isoformat(), "action": e.action,
            "by": f"{e.by.user}@{e.by.host}", "reason": e.reason} for a, e in state.items()}}


def _size(m: Manifest) -> int:
    return sum(f.size for a in m.artifacts for f in a.files)


def _verdict(m: Manifest) -> str:
    statuses = {a.verification.status for a in m.artifacts}
    return "failed" if "failed" in statuses else "unverified" if "unverified" in statuses or not statuses else "passed"


def models_doc(reader: Reader) -> dict[str, Any]:
    """The models page: every model, its aliases, its latest version's formats and size, the last alias change."""
    store = reader.store
    return {"store": store.location, "models": [model_summary(reader, name) for name in store.models()]}


def rollouts_doc(reader: Reader, name: str, aliases: dict[str, int]) -> list[dict[str, Any]]:
    """The staged rollouts in progress on a model's aliases, as `mreg rollout status --json` names their fields."""
    out = []
    for alias in sorted(aliases):
        rec = reader.store.rollout(name, alias)
        if rec is None or rec.state not in ("running", "paused"):
            continue
        out.append({"alias": alias, "stable": rec.stable, "canary": rec.canary, "weight": rec.weight,
                    "state": rec.state, "steps": list(rec.steps), "step": rec.step,
                    "started": rec.started.at.isoformat(), "by": rec.started.user})
    return out


def model_summary(reader: Reader, name: str) -> dict[str, Any]:
    """One row of the models page (problems marked on the row)."""
    store, problems = reader.store, Problems()
    doc: dict[str, Any] = {"name": name, "versions": 0, "latest": None, "aliases": {}, "formats": [], "bytes": None,
                           "last_change": None, "rollouts": []}
    numbers: list[int] = []
    with problems.item("versions"):
        numbers = store.versions(name)
        doc["versions"] = len(numbers)
    with problems.item("aliases"):
        doc["aliases"] = store.aliases(name)
    with problems.item("rollouts"):
        doc["rollouts"] = rollouts_doc(reader, name, doc["aliases"])
    if numbers:
        with problems.item(f"{name}@{numbers[-1]}"):
            m = reader.version(name, numbers[-1]).manifest
            doc.update(latest=numbers[-1], formats=[a.format for a in m.artifacts], bytes=_size(m))
    with problems.item("history"):
        history = store.history(name)
        doc["last_change"] = entry_doc(history[-1]) if history else None
    doc["problems"] = problems.docs
    return doc


def version_row(reader: Reader, name: str, number: int, aliases: dict[str, int]) -> dict[str, Any]:
    """One row of a model's versions table: formats, sizes, verdicts, golden checks, signatures, source, creator."""
    problems = Problems()
    row: dict[str, Any] = {"version": number, "aliases": sorted(a for a, n in aliases.items() if n == number)}
    with problems.item(f"{name}@{number}"):
        v = reader.version(name, number)
        m = v.manifest
        row.update(manifest_sha256=v.manifest_sha256, parent=m.parent, bytes=_size(m), verdict=_verdict(m),
                   formats=[{"format": a.format, "bytes": sum(f.size for f in a.files),
                             "verification": a.verification.status} for a in m.artifacts],
                   source={"repo": m.source.repo, "commit": m.source.commit, "kind": m.source.kind},
                   created={"at": m.created.at.isoformat(), "by": f"{m.created.user}@{m.created.host}"})
        row.update(checks=[], signatures=[])
        with problems.item(f"checks of {name}@{number}"):
            records = reader.store.check_records(name, number) or []
            row["checks"] = [{"golden": r.golden, "format": r.format, "runtime": r.runtime, "passed": r.passed,
                              "at": r.at.isoformat()} for r in records]
        with problems.item(f"signatures of {name}@{number}"):
            row["signatures"] = _signatures(reader, v)
    row["problems"] = problems.docs
    return row


def _signatures(reader: Reader, v: Version) -> list[dict[str, Any]]:
    from registry.store.signatures import shown

    return shown(reader.store, v, reader.trust(v.name))


def model_doc(reader: Reader, name: str, at: dt.datetime | None = None) -> dict[str, Any]:
    """A model's page: aliases, every version's row, the history, and with `at` the aliases as they were then."""
    from registry.errors import ModelNotFound
    from registry.refs import check_name
    from registry.release.aliases import aliases_at

    check_name(name)
    store, problems = reader.store, Problems()
    if not store.has_model(name):
        raise ModelNotFound(name)
    aliases: dict[str, int] = {}
    numbers: list[int] = []
    history: list[HistoryEntry] = []
    with problems.item("aliases"):
        aliases = store.aliases(name)
    with problems.item("versions"):
        numbers = store.versions(name)
    with problems.item("history"):
        history = store.history(name)
    rollouts: list[dict[str, Any]] = []
    with problems.item("rollouts"):
        rollouts = rollouts_doc(reader, name, aliases)
    doc: dict[str, Any] = {
        "name": name, "aliases": aliases, "rollouts": rollouts,
        "versions": [version_row(reader, name, n, aliases) for n in numbers],
        "history": [entry_doc(e) for e in history],
        "as_of": aliases_at_doc(name, at, aliases_at(history, at)) if at is not None else None,
    }
    doc["problems"] = problems.docs
    return doc


def version_doc(reader: Reader, name: str, number: int, *, memory_gib: float | None = DEFAULT_MEMORY_GIB,
                context: int | None = None, cache_type: str = "f16") -> dict[str, Any]:
    """A version's page: `mreg show --json` (with `--memory`: the serving figures), its golden checks, its files."""
    from registry.refs import check_name
    from registry.serving.memory import memory_doc, plan
    from registry.store.protocol import manifest_json

    check_name(name)
    v = reader.version(name, number)  # the page's one item: a damaged manifest is the page's error
    m, problems = v.manifest, Problems()
    aliases: list[str] = []
    with problems.item("aliases"):
        aliases = sorted(a for a, n in reader.store.aliases(name).items() if n == number)
    doc: dict[str, Any] = {"name": name, "version": number, "path": v.path, "manifest_sha256": v.manifest_sha256,
                           "aliases": aliases, "signatures": [], "manifest": manifest_json(m)}
    with problems.item("signatures"):
        doc["signatures"] = _signatures(reader, v)
    doc["checks"] = []
    with problems.item("checks"):
        doc["checks"] = [r.model_dump(mode="json", by_alias=True)
                         for r in reader.store.check_records(name, number) or []]
    doc["serving"] = None
    if memory_gib is not None and m.model is not None and m.model.kv_cache is not None:
        with problems.item("serving"):
            doc["serving"] = memory_doc(plan(m, memory_gib, context=context, cache_type=cache_type), v.path, m)
    doc["problems"] = problems.docs
    return doc


def compare_doc(reader: Reader, name: str, a: int, b: int) -> dict[str, Any]:
    """Two versions side by side: files added, removed and changed (by format and path), sizes, figures."""
    from registry.refs import check_name

    check_name(name)
    va, vb = reader.version(name, a), reader.version(name, b)
    fa, fb = _files(va.manifest), _files(vb.manifest)
    changed = sorted(p for p in fa.keys() & fb.keys() if fa[p]["sha256"] != fb[p]["sha256"])
    formats = sorted({x.format for x in va.manifest.artifacts} | {x.format for x in vb.manifest.artifacts})
    return {
        "name": name, "a": _side(va), "b": _side(vb),
        "files": {
            "added": [{"path": p, **fb[p]} for p in sorted(fb.keys() - fa.keys())],
            "removed": [{"path": p, **fa[p]} for p in sorted(fa.keys() - fb.keys())],
            "changed": [{"path": p, "a": fa[p], "b": fb[p]} for p in changed],
            "same": len(fa.keys() & fb.keys()) - len(changed),
        },
        "artifacts": [{"format": f, "a": _figures(va.manifest, f), "b": _figures(vb.manifest, f)} for f in formats],
    }


def _files(m: Manifest) -> dict[str, dict[str, Any]]:
    return {f"{a.path}/{f.path}": {"size": f.size, "sha256": f.sha256} for a in m.artifacts for f in a.files}


def _side(v: Version) -> dict[str, Any]:
    m = v.manifest
    return {"version": v.number, "manifest_sha256": v.manifest_sha256, "bytes": _size(m), "verdict": _verdict(m),
            "source": f"{m.source.repo}@{m.source.commit}", "created": m.created.at.isoformat()}


def _figures(m: Manifest, fmt: str) -> dict[str, Any] | None:
    art = next((x for x in m.artifacts if x.format == fmt), None)
    if art is None:
        return None
    return {"bytes": sum(f.size for f in art.files), "files": len(art.files), "weights_bytes": art.weights_bytes,
            "verification": art.verification.status, "method": art.verification.method,
            "metrics": art.verification.metrics, "converter": f"{art.converter.name} {art.converter.version}"}
