"""`mreg list`, `show`, `history`, `resolve`, `verify`, `gc`: reading a store and keeping it clean."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from registry import api
from registry.cli.group import ReportedFailure
from registry.cli.options import (
    FiniteNumber,
    WholeNumber,
    any_store,
    config_option,
    json_option,
    progress_for,
    settings_for,
    store_option,
)
from registry.cli.render import Output, table
from registry.cli.sign import result_line
from registry.errors import IntegrityError, UsageError
from registry.refs import check_name
from registry.units import human_size
from registry.web.documents import aliases_at_doc

if TYPE_CHECKING:
    from manifests import Artifact, BuildMachine, HistoryEntry
    from registry.store.signatures import SignatureResult
    from registry.store.verify import VerifyReport


@click.command("list")
@click.argument("name", required=False)
@config_option
@store_option
@json_option
def list_cmd(name: str | None, config_path: str | None, store: str | None, as_json: bool) -> None:
    """List the models in the store, or the versions of one model."""
    st = any_store(settings_for(config_path, store=store))
    out = Output(as_json)
    if name is None:
        listing = api.list_models(st)
        problems = list(listing.problems)
        failure = _stray_failure(problems)
        lines = [[m.name, str(len(m.versions)), ", ".join(f"{a}→{n}" for a, n in m.aliases.items())]
                for m in listing.models]
        out.result({"store": listing.location,
                    "models": [{"name": m.name, "versions": len(m.versions), "aliases": m.aliases}
                               for m in listing.models],
                    "problems": [str(e) for e in problems]},
                   lambda: _with(table(lines, ["MODEL", "VERSIONS", "ALIASES"]) if lines else "(no models)", problems),
                   failure=failure)
        if failure is not None:
            raise ReportedFailure(failure)
        return
    versions = api.list_versions(st, name)
    problems = list(versions.problems)
    rows: list[dict[str, Any]] = []
    for v in versions.versions:
        m = v.manifest
        rows.append({
            "version": v.number, "formats": [a.format for a in m.artifacts],
            "aliases": sorted(a for a, t in versions.aliases.items() if t == v.number),
            "source": f"{m.source.repo}@{m.source.commit[:12]}", "created": m.created.at.isoformat(),
            "manifest_sha256": v.manifest_sha256, "bytes": sum(f.size for a in m.artifacts for f in a.files),
        })
    failure = _stray_failure(problems)
    out.result({"name": name, "versions": rows, "problems": [str(e) for e in problems]}, lambda: _with(table(
        [[str(r["version"]), ",".join(r["formats"]), ",".join(r["aliases"]), r["source"],
          human_size(r["bytes"]), r["created"][:19], r["manifest_sha256"][:12]] for r in rows],
        ["VERSION", "FORMATS", "ALIASES", "SOURCE", "SIZE", "CREATED", "MANIFEST"]), problems), failure=failure)
    if failure is not None:
        raise ReportedFailure(failure)


def _stray_failure(problems: list[IntegrityError]) -> IntegrityError | None:
    """The one error line of a listing that found entries it could not list (exit 4; the rest was listed)."""
    from registry.store.protocol import first_of

    return first_of(problems) if problems else None


def _with(text: str, problems: list[IntegrityError]) -> str:
    """A report's text and, under it, every problem found on the way."""
    return "\n".join([text, *(f"✗ {e}" for e in problems)])


@click.command("show")
@click.argument("ref", metavar="NAME[@REF]")
@click.option("--memory", "memory_gib", type=FiniteNumber(0, 1 << 20, open_low=True), metavar="GiB",
              help="Also answer what fits in this much device memory: concurrent sequences, one sequence's "
                   "largest context, and the vLLM / llama.cpp settings that say so.")
@click.option("--context", type=WholeNumber(1), metavar="N",
              help="With --memory: tokens per sequence (default: the model's max context, capped at 32768).")
@click.option("--cache-type", type=click.Choice(["f16", "q8_0", "q4_0"]), default="f16", show_default=True,
              help="With --memory: the KV cache's element type.")
@click.option("--utilization", type=FiniteNumber(0, 1, open_low=True), default=0.9, show_default=True,
              help="With --memory: the share of the device the engine may take (vLLM's --gpu-memory-utilization).")
@click.option("--reserve", "reserve_gib", type=FiniteNumber(0, 1 << 20), default=1.0, show_default=True, metavar="GiB",
              help="With --memory: held back inside that share for activations and CUDA graphs.")
@config_option
@store_option
@json_option
def show_cmd(ref: str, memory_gib: float | None, context: int | None, cache_type: str, utilization: float,
             reserve_gib: float, config_path: str | None, store: str | None, as_json: bool) -> None:
    """Show a version's manifest (REF: number, alias, `latest`, or manifest digest prefix).

    With --memory GiB, also what it costs to serve: from the manifest alone (weights' bytes per
    artifact, KV-cache bytes per token), how many sequences of --context tokens fit beside the
    weights in memory × utilization − reserve, and the engine settings for that.
    """
    from registry.cli.memory import memory_lines
    from registry.serving.memory import memory_doc
    from registry.store.protocol import manifest_json

    settings = settings_for(config_path, store=store)
    st = any_store(settings)
    # Signatures are judged by the model's policy: untrusted, every one, where no policy is configured.
    details = api.show(st, ref, trust=lambda n: api.trust_policy(settings, n))
    v, aliases, sig_docs = details.version, list(details.aliases), details.signatures
    sig_lines = [result_line(d) for d in sig_docs]
    doc = {"name": v.name, "version": v.number, "path": v.path, "manifest_sha256": v.manifest_sha256,
           "aliases": aliases, "signatures": sig_docs, "manifest": manifest_json(v.manifest)}
    m = v.manifest
    serving = None
    if memory_gib is not None:
        serving = api.serving_memory(st, f"{v.name}@{v.number}", memory_gib, context=context, cache_type=cache_type,
                                     utilization=utilization, reserve_gib=reserve_gib)
        doc["serving"] = memory_doc(serving, v.path, m)
    elif context is not None:
        raise UsageError("--context goes with --memory", hint="add --memory GiB, e.g. --memory 80")

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
            lines += [f"  {'':<9} not run: {line}" for line in a.verification.unrun()]
            quality = _quality(a.verification.metrics, a.verification.budget)
            if quality:
                lines.append(f"  {'':<9} quality: {quality}")
            imx = getattr(a.requirements, "imatrix", None)
            if imx is not None:
                text = f", {imx.tokens} tokens" if imx.tokens is not None else ""
                maker = "made by mreg" if imx.made_by == "mreg" else "given"
                lines.append(f"  {'':<9} imatrix: {imx.file} ({maker}; {imx.dataset or '?'}{text}, "
                             f"{imx.chunks} chunks of {imx.chunk_size})")
            if a.weights_bytes is not None:
                lines.append(f"  {'':<9} weights {human_size(a.weights_bytes)}")
            lines += [f"  {'':<9} {line}" for line in _selection(a, v.path)]
            if a.built_on is not None:
                lines.append(f"  {'':<9} built on {_machine(a.built_on)}")
        if m.model is not None and m.model.kv_cache is not None:
            kv = m.model.kv_cache
            per = ", ".join(f"{t} {human_size(n)}" for t, n in kv.bytes_per_token.items())
            window = ""
            if kv.window_bytes_per_token:
                window = f"; window layers ({kv.sliding_window} tokens): " + ", ".join(
                    f"{t} {human_size(n)}" for t, n in kv.window_bytes_per_token.items())
            lines.append(f"  kv cache  per token: {per}{window}")
        if serving is not None:
            lines += memory_lines(serving, v.path, m)
        lines.append(f"  signatures {len(sig_docs) or 'none'}")
        lines += [f"    {line}" for line in sig_lines]
        return "\n".join(lines)

    Output(as_json).result(doc, human)


def _machine(m: BuildMachine) -> str:
    """Where an artifact was built, on one line: host, CPU, GPUs with driver and CUDA, TensorRT, mreg."""
    parts = [f"{m.host} ({m.os or '?'}, {m.arch or '?'})", f"CPU {m.cpu or '?'} x{m.cpus}"]
    if m.cpu_flags:
        parts[-1] += f" [{' '.join(m.cpu_flags)}]"
    for g in m.gpus:
        parts.append(f"GPU {g.product} {g.compute_capability or ''}".rstrip())
    if m.driver or m.cuda:
        parts.append(f"driver {m.driver or '?'}, CUDA {m.cuda or '?'}")
    parts += [f"{dist} {ver}" for dist, ver in m.tensorrt.items()]
    parts.append(f"mreg {m.mreg_version}")
    return "; ".join(parts)


def _selection(a: Artifact, path: str) -> list[str]:
    """How `gguf:auto` chose the type, and where its chart is (nothing for a type given by name)."""
    req = a.requirements
    sel = getattr(req, "selection", None)
    if sel is None:
        return []
    budget = ", ".join(f"{k} {'>=' if k == 'top1_agreement' else '<='} {b:g}" for k, b in sel.budget.items())
    lines = [f"auto: {sel.chosen}, the smallest of {len(sel.candidates)} candidates meeting {budget} "
             f"({sel.tried} tried, {sel.search})"]
    if sel.chart:
        lines.append(f"chart: {path}/{a.path}/{sel.chart}")
    return lines


def _quality(metrics: dict[str, float], budget: dict[str, float]) -> str:
    """A quantized file's figures against the reference, one line (empty when none were measured)."""
    if "kl_divergence" not in metrics:
        return ""
    parts = [f"KL {metrics['kl_divergence']:.3g}"]
    if "kl_divergence_p99" in metrics:
        parts.append(f"p99 {metrics['kl_divergence_p99']:.3g}")
    if "kl_divergence" in budget:
        within = metrics["kl_divergence"] <= budget["kl_divergence"]
        parts.append(f"budget {budget['kl_divergence']:g} ({'within' if within else 'OVER'})")
    if "top1_agreement" in metrics:
        parts.append(f"top-1 {metrics['top1_agreement']:.2f}")
    if "perplexity_ratio" in metrics:
        parts.append(f"perplexity x{metrics['perplexity_ratio']:.3f}")
    if "evaluation_tokens" in metrics:
        parts.append(f"on {int(metrics['evaluation_tokens'])} tokens of the evaluation text")
    return ", ".join(parts)


@click.command("history")
@click.argument("name")
@click.option("--alias", default=None, help="Only this alias.")
@click.option("--at", "at", default=None, metavar="TIME",
              help="Instead: which version every alias pointed to at this time (ISO 8601, e.g. 2026-12-03T17:00Z; "
                   "UTC when no offset is given), and since when.")
@config_option
@store_option
@json_option
def history_cmd(name: str, alias: str | None, at: str | None, config_path: str | None, store: str | None,
                as_json: bool) -> None:
    """Show every alias change of a model: who, when, from, to, why (with --at: the aliases as they were then)."""
    check_name(name)
    st = any_store(settings_for(config_path, store=store))
    if at is not None:
        from registry.release.aliases import parse_time

        state = api.aliases_at(st, name, at, alias=alias)
        doc = aliases_at_doc(name, parse_time(at), state)
        Output(as_json).result(doc, lambda: table(
            [[a, str(e["version"]), e["since"][:19], e["action"], e["by"], e["reason"] or ""]
             for a, e in doc["aliases"].items()],
            ["ALIAS", "VERSION", "SINCE", "ACTION", "BY", "WHY"]) if state else f"(no alias existed at {at})")
        return
    entries = api.history(st, name, alias=alias)
    docs = [e.model_dump(mode="json", by_alias=True) for e in entries]
    Output(as_json).result({"name": name, "entries": docs}, lambda: table(
        [[e.by.at.isoformat()[:19], e.alias, e.action, str(e.from_version or "-"), str(e.to_version),
          f"{e.by.user}@{e.by.host}", _why(e)] for e in entries],
        ["WHEN", "ALIAS", "ACTION", "FROM", "TO", "BY", "WHY"]) if entries else "(no alias changes)")


def _why(e: HistoryEntry) -> str:
    """The reason, and for a rollout step the canary's weight and each gate's value."""
    if e.rollout is None:
        return e.reason or ""
    r = e.rollout
    gates = "; ".join(f"{g.gate} {'pass' if g.passed else 'FAIL'}" + (f" {g.value:g}" if g.value is not None else "")
                      for g in r.gates)
    return " ".join(x for x in (f"canary {r.canary} at {r.weight}%", f"[{gates}]" if gates else "", e.reason or "")
                    if x)


@click.command("resolve")
@click.argument("ref", metavar="NAME[@REF]")
@click.option("--format", "fmt", default="hf", show_default=True, help="Artifact format.")
@click.option("--physical", is_flag=True, help="Print the version directory instead of the alias path.")
@config_option
@store_option
@json_option
def resolve_cmd(ref: str, fmt: str, physical: bool, config_path: str | None, store: str | None,
                as_json: bool) -> None:
    """Print the path a serving engine should mount for a version's artifact.

    For an alias (NAME@production) this is the alias path, which follows promotions and
    rollbacks; for a number it is the immutable version directory.
    """
    r = api.resolve(any_store(settings_for(config_path, store=store)), ref, fmt=fmt, physical=physical)
    doc = {"name": r.name, "version": r.version, "format": r.format, "path": r.path,
           "version_path": r.version_path, "alias": r.alias}
    Output(as_json).result(doc, r.path)


@click.command("verify")
@click.argument("refs", nargs=-1, metavar="[NAME@REF]...")
@click.option("--all", "all_", is_flag=True, help="Verify every version in the store.")
@click.option("--signatures", is_flag=True,
              help="Also judge each version's signatures against the trust policy (valid, invalid, untrusted).")
@config_option
@store_option
@json_option
def verify_cmd(refs: tuple[str, ...], all_: bool, signatures: bool, config_path: str | None, store: str | None,
               as_json: bool) -> None:
    """Re-hash every file of the given versions offline; exit 4 on any mismatch, missing or extra file.

    With --signatures, each signature is also judged against the trust policy (`[trust]`, or
    `[models.NAME.trust]`): exit 4 as well when a signature is invalid or a version has no valid one.
    """
    from registry.store.signatures import result_doc

    settings = settings_for(config_path, store=store)
    st = any_store(settings)
    reports = api.verify(st, refs, all_versions=all_, progress=progress_for(as_json))
    judged: dict[tuple[str, int], list[SignatureResult]] = {}
    if signatures:
        for r in reports:
            # The bytes were just re-hashed by the report: the signatures are judged against the manifest.
            judged[(r.name, r.version)] = api.verify_signatures(
                st, st.version(r.name, r.version), api.trust_policy(settings, r.name), rehash=False) if r.ok else []
    unsigned = [k for k, res in judged.items()
                if not any(x.status == "valid" for x in res) or any(x.status == "invalid" for x in res)]
    bad = [r for r in reports if not r.ok]
    strays = api.strays(st) if all_ else []
    failure = (_verify_failure(reports, strays) if bad or strays else _signature_failure(unsigned) if unsigned
               else None)
    docs: list[dict[str, Any]] = []
    for r in reports:
        docs.append({"name": r.name, "version": r.version, "files": r.files, "bytes": r.bytes, "ok": r.ok,
                     "problems": list(r.problems)})
        if signatures:
            docs[-1]["signatures"] = [result_doc(x) for x in judged[(r.name, r.version)]]
            docs[-1]["signed"] = (r.name, r.version) not in unsigned

    def human() -> str:
        lines = []
        for r in reports:
            lines.append(f"✓ {r.name}@{r.version}: {r.files} files, {human_size(r.bytes)} match their digests"
                         if r.ok else f"✗ {r.name}@{r.version}:\n" + "\n".join(f"    {p}" for p in r.problems))
            if signatures and r.ok:
                res = judged[(r.name, r.version)]
                lines += [f"    {result_line(result_doc(x))}" for x in res] or ["    ✗ no signatures"]
        return _with("\n".join(lines), strays)

    Output(as_json).result({"ok": not bad and not unsigned and not strays, "versions": docs,
                            "problems": [str(e) for e in strays]}, human, failure=failure)
    if failure is not None:
        raise ReportedFailure(failure)


def _verify_failure(reports: list[VerifyReport], strays: list[IntegrityError]) -> IntegrityError:
    """The one error line of a failed verification, with the next step for what was found."""
    bad = [r for r in reports if not r.ok]
    if not bad:  # every version verified; the store also holds what mreg did not write
        failure = _stray_failure(strays)
        assert failure is not None
        return failure
    hint = "re-publish the damaged versions from their source (`mreg convert`), then `mreg gc --yes`"
    if any(r.links for r in bad):  # gc refuses while they are there; removing a link leaves its target alone
        hint = "remove each symlink named above (`rm LINK`, no trailing slash: its target stays), " + hint
    more = f"; and {len(strays)} entries mreg did not write (listed above)" if strays else ""
    return IntegrityError(f"{len(bad)} of {len(reports)} version(s) failed verification: "
                          + ", ".join(f"{r.name}@{r.version}" for r in bad) + more, hint=hint)


def _signature_failure(unsigned: list[tuple[str, int]]) -> IntegrityError:
    names = ", ".join(f"{n}@{v}" for n, v in unsigned)
    return IntegrityError(f"{len(unsigned)} version(s) have no valid signature under the trust policy, or an "
                          f"invalid one: {names}",
                          hint="see each signature's verdict above; sign with a trusted key (`mreg sign`) or fix "
                               "[trust] in the config file")


@click.command("gc")
@click.option("--keep-history", type=WholeNumber(), default=10, show_default=True,
              help="Keep versions named by the last N alias changes.")
@click.option("--keep-latest", type=WholeNumber(), default=3, show_default=True,
              help="Keep the newest K versions of each model.")
@click.option("--dry-run", is_flag=True, help="Only show the plan (the default without --yes).")
@click.option("--yes", is_flag=True, help="Carry out the plan.")
@click.option("--grace-hours", type=FiniteNumber(0, 24 * 365 * 100), default=24.0, show_default=True,
              help="S3 stores: only blobs older than this are removed (pushes in flight are protected by leases).")
@config_option
@store_option
@json_option
def gc_cmd(keep_history: int, keep_latest: int, dry_run: bool, yes: bool, grace_hours: float, config_path: str | None,
           store: str | None, as_json: bool) -> None:
    """Remove unreachable versions, blobs and leftovers of interrupted writes (plan only unless --yes).

    Never removes a version an alias points to, one named by the last --keep-history alias
    changes, or one of the newest --keep-latest versions. On S3, only unreferenced blobs older
    than --grace-hours are removed; versions are kept. A removed version's signature records go
    with it.
    """
    st = any_store(settings_for(config_path, store=store))
    applied = yes and not dry_run
    plan = api.gc(st, keep_history=keep_history, keep_latest=keep_latest, grace_hours=grace_hours, apply=applied)
    doc = {"applied": applied, "versions": [{"name": n, "version": v} for n, v in plan.versions],
           "blobs": len(plan.blobs), "blob_bytes": plan.blob_bytes, "staging": list(plan.staging),
           "stale_leases": len(plan.leases), "kept": [{"name": n, "version": v, "why": w} for n, v, w in plan.kept],
           "signatures": [{"name": n, "version": v} for n, v in plan.signatures]}
    verb = "removed" if applied else "would remove"

    def human() -> str:
        lines = [f"{verb}: {len(plan.versions)} version(s), {len(plan.blobs)} blob(s) "
                 f"({human_size(plan.blob_bytes)}), {len(plan.staging)} interrupted write(s), "
                 f"{len(plan.leases)} stale lease(s)"
                 + (f", the signature records of {len(plan.signatures)} removed version(s)" if plan.signatures else "")]
        lines += [f"  - {n}@{v}" for n, v in plan.versions]
        lines += [f"  kept {n}@{v}: {w}" for n, v, w in plan.kept]
        if not applied:
            lines.append("run again with --yes to carry this out")
        return "\n".join(lines)

    Output(as_json).result(doc, human)
