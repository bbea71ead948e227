"""`mreg promote`, `rollback`, `mount-check`, `check`: releasing versions to engines, with gates and hooks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from registry import api
from registry.cli.group import ReportedFailure
from registry.cli.options import (
    FiniteNumber,
    any_store,
    config_option,
    json_option,
    local_store,
    quiet_hub,
    settings_for,
    store_option,
)
from registry.cli.render import Output, table
from registry.convert import formats
from registry.errors import CheckFailed, IntegrityError, MregError
from registry.refs import check_alias, check_name, version_number
from registry.release.expect import parse_expect

if TYPE_CHECKING:
    from registry.release.aliases import AliasChange


def _change_doc(c: AliasChange) -> dict[str, Any]:
    return {"name": c.name, "alias": c.alias, "from": c.from_version, "to": c.to_version, "changed": c.changed,
            "action": c.action}


def _change_text(c: AliasChange) -> str:
    if not c.changed:
        return f"✓ {c.name} {c.alias} already at {c.to_version}; nothing changed"
    return f"✓ {c.name} {c.alias}: {c.from_version if c.from_version is not None else '(unset)'} → {c.to_version}"


@click.command("promote")
@click.argument("ref", metavar="NAME@VERSION")
@click.option("--alias", default="production", show_default=True, help="Alias to move.")
@click.option("--expect", metavar="VERSION|none", help="Only if the alias currently points here (else exit 5).")
@click.option("-m", "--message", help="Why (recorded in the history).")
@click.option("--require", multiple=True, metavar="FORMAT[:ARGS]",
              help="Refuse unless the version has this format (tensorrt:sm_80 engines for a GPU; gguf:quality or "
                   "gguf:kl=0.02,top1=0.9 GGUF quality within a budget), check[:GOLDEN] passed, `signature`: "
                   "a signature that verifies against the trust policy, or `loaded`: every artifact loaded and "
                   "run by its runtime (refuses a GGUF llama.cpp never loaded; gguf:loaded: the GGUF files only).")
@click.option("--force", is_flag=True, help="Promote even when a gate refuses, or the alias is under a staged "
                                            "rollout (aborted first).")
@click.option("--reload", "reload_cmd", metavar="CMD", help="After the flip, run this (sh -c) so the engine reloads.")
@click.option("--reload-url", metavar="URL", help="After the flip, POST to this URL (an engine's reload endpoint).")
@click.option("--ready-url", metavar="URL", help="Then GET this until it answers 2xx.")
@click.option("--ready-cmd", metavar="CMD", help="Then run this until it exits 0.")
@click.option("--ready-timeout", type=FiniteNumber(0, 86400, open_low=True), metavar="SECONDS",
              help="How long to wait for readiness (default 60).")
@config_option
@store_option
@json_option
def promote_cmd(ref: str, alias: str, expect: str | None, message: str | None, require: tuple[str, ...], force: bool,
            reload_cmd: str | None, reload_url: str | None, ready_url: str | None, ready_cmd: str | None,
            ready_timeout: float | None, config_path: str | None, store: str | None, as_json: bool) -> None:
    """Point an alias at a version with one atomic symlink flip, and record it in the history.

    Gates: a version whose verification failed, or without a --require'd format, is refused
    (exit 6) unless --force. `--require signature` (or `require = ["signature"]` under
    `[models.NAME]`) needs a signature that verifies against the trust policy; `--require loaded`
    refuses an artifact its runtime never loaded (a `structural` GGUF: converted without
    llama.cpp). Promoting to the current target changes nothing.

    Hooks (flags, or `[models.NAME]` in the config file: reload, reload_url, ready_url,
    ready_cmd, ready_timeout): after the flip mreg reloads the engine and waits until it is
    ready; if it is not, the alias is flipped back, both changes are recorded, and mreg exits 10.
    Commands see MREG_NAME, MREG_ALIAS, MREG_VERSION, MREG_FROM_VERSION, MREG_PATH.
    """
    settings = settings_for(config_path, store=store)
    done = api.promote(any_store(settings), ref, alias=alias, expect=parse_expect(expect), reason=message,
                       require=require, force=force, policy=settings.raw, reload_cmd=reload_cmd,
                       reload_url=reload_url, ready_url=ready_url, ready_cmd=ready_cmd,
                       ready_timeout_s=ready_timeout, trust=api.trust_policy(settings, ref.split("@", 1)[0]))
    doc = _change_doc(done.change)
    if done.report is not None:
        doc["hooks"] = {"ready": done.report.ready, "seconds": round(done.report.seconds, 3),
                        "steps": list(done.report.steps)}
    Output(as_json).result(doc, _change_text(done.change) + (
        f" (engine ready after {done.report.seconds:.1f}s)" if done.report else ""))


@click.command("mount-check")
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
    violation; exit 4 when a symlink leads out of its place (the alias out of the root, or one on
    the way to the version's files): an engine would serve what is not the store's.
    """
    check_name(name)  # before the store is opened: a bad name is refused as such, whatever --store says
    check_alias(alias)
    report = api.mount_check(local_store(settings_for(config_path, store=store)), name, alias=alias,
                             mount_root=mount_root, verify=full)
    failure: MregError | None = None
    if report.escapes:  # an engine would serve bytes that are not the store's: an integrity failure
        failure = IntegrityError(f"{name} {alias}: a symlink leads out of its place in the store",
                                 hint="remove each symlink named above (`rm LINK`, no trailing slash: its target "
                                      "stays), then re-publish or re-sync the version and promote it")
    elif report.damaged:
        failure = IntegrityError(f"{name} {alias}: {len(report.damaged)} file(s) do not match their digests",
                                 hint="re-publish the version from its source (`mreg convert`), promote it, then "
                                      "`mreg gc --yes`")
    elif not report.ok:
        failure = MregError(f"{name} {alias} does not meet the mount contract",
                            hint="see the problems above and the README's serving section")
    doc = {"name": name, "alias": alias, "version": report.version, "ok": report.ok,
           "problems": list(report.problems), "paths": report.paths}
    Output(as_json).result(doc, lambda: "\n".join(
        ([f"✓ {name} {alias} → {report.version} meets the mount contract"] if report.ok else
         [f"✗ {name} {alias}:"] + [f"    {p}" for p in report.problems])
        + [f"  {fmt:<9} {path}" for fmt, path in report.paths.items()]), failure=failure)
    if failure is not None:
        raise ReportedFailure(failure)


@click.command("rollback")
@click.argument("name")
@click.option("--alias", default="production", show_default=True, help="Alias to move back.")
@click.option("--to", "to", metavar="VERSION", help="Go to this version instead of the previous one.")
@click.option("--expect", metavar="VERSION", help="Only if the alias currently points here (else exit 5).")
@click.option("-m", "--message", help="Why (recorded in the history).")
@click.option("--force", is_flag=True, help="Roll back an alias under a staged rollout (aborts the rollout first).")
@config_option
@store_option
@json_option
def rollback_cmd(name: str, alias: str, to: str | None, expect: str | None, message: str | None, force: bool,
             config_path: str | None, store: str | None, as_json: bool) -> None:
    """Move an alias back to the version it pointed at before; repeat to walk further back.

    An alias under a staged rollout (`mreg rollout`) is refused (exit 5) unless --force, which
    aborts the rollout first.
    """
    target = None if to is None else version_number(to, "--to")  # a usage error before the store is opened
    st = any_store(settings_for(config_path, store=store))
    change = api.rollback(st, name, alias=alias, to=target, expect=parse_expect(expect), reason=message,
                          force=force)
    Output(as_json).result(_change_doc(change), _change_text(change))


@click.command("check")
@click.argument("ref", metavar="NAME@REF")
@click.option("--golden", required=True, type=click.Path(path_type=Path),
              help="Golden cases, one JSON object per line.")
@click.option("--format", "fmt", type=click.Choice(formats.runnable()),
              help="Artifact to run (default: " + ", else ".join(formats.runnable()) + ").")
@click.option("--min-hit-rate", default=1.0, show_default=True, help="Share of `contains` keywords that must hit.")
@click.option("--record-baseline", is_flag=True, help="Store these outputs as the expected ones for later versions.")
@config_option
@store_option
@json_option
def check_cmd(ref: str, golden: Path, fmt: str | None, min_hit_rate: float, record_baseline: bool,
          config_path: str | None, store: str | None, as_json: bool) -> None:
    """Run a golden set through a version's artifact (greedy, fixed seed) and record the result.

    Each case gives `prompt`, `messages` (rendered with the model's chat template, with the case's
    optional `tools`, as transformers renders it) or `text` (encoders), and `expect`: contains /
    not_contains (keywords), regex, json (true or a JSON Schema), max_latency_ms, min_tokens_per_s,
    min_cosine. Once a baseline is recorded, later
    versions must reproduce its outputs. The record is kept beside the version (the manifest is
    not touched); `mreg promote --require check[:GOLDEN]` insists on a passing one. Exit 11 on failure.
    """
    quiet_hub(as_json)  # a runtime that loads through transformers draws the hub's bars on stderr otherwise
    rec = api.check(local_store(settings_for(config_path, store=store)), ref, golden, fmt=fmt,
                    min_hit_rate=min_hit_rate, record_baseline=record_baseline)
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
        raise ReportedFailure(CheckFailed(f"{rec.name}@{rec.version} failed golden set {rec.golden!r}",
                                          hint="see the failing cases above; the record is kept, so promotion "
                                               "gates see it"))
