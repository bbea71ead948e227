"""`mreg rollout start|status|advance|pause|resume|abort|run|render`: a staged release, gated at every step."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from registry import api
from registry.cli.group import ReportedFailure
from registry.cli.options import any_store, config_option, json_option, settings_for, store_option
from registry.cli.render import Output
from registry.errors import NotFound
from registry.refs import check_name
from registry.release.expect import parse_expect

if TYPE_CHECKING:
    from manifests import RolloutRecord
    from registry.release.rollout import Outcome


def _record_doc(rec: RolloutRecord | None) -> dict[str, Any] | None:
    if rec is None:
        return None
    doc: dict[str, Any] = rec.model_dump(mode="json")
    doc.pop("schema_version", None)
    return doc


def _doc(name: str, alias: str, out: Outcome) -> dict[str, Any]:
    return {"name": name, "alias": alias, "changed": out.changed, "rollout": _record_doc(out.record),
            "gates": [g.model_dump(mode="json") for g in out.gates], "apply": out.applied,
            "steps_taken": [{"step": r.step, "weight": r.weight, "state": r.state} for r in out.steps]}


def _line(rec: RolloutRecord | None) -> str:
    if rec is None:
        return "(no rollout)"
    where = {"done": f"done: {rec.alias} → {rec.canary}", "aborted": f"aborted; {rec.alias} stays at {rec.stable}"}
    head = where.get(rec.state, f"{rec.state}: {rec.canary} at {rec.weight}%, {rec.stable} at {100 - rec.weight}%")
    steps = ",".join(f"[{w}]" if i == rec.step else str(w) for i, w in enumerate(rec.steps))
    return (f"{'✓' if rec.state != 'aborted' else '✗'} {rec.name} {rec.alias} rollout {rec.stable} → {rec.canary} "
            f"{head} (steps {steps}{'' if rec.applied else '; apply pending'})")


def _human(out: Outcome) -> Callable[[], str]:
    def text() -> str:
        lines = [_line(r) for r in out.steps[:-1]] + [_line(out.record)]
        lines += [f"    {'pass' if g.passed else 'FAIL'} {g.gate}: {g.detail}" for g in out.gates]
        return "\n".join(lines)
    return text


def _report(name: str, alias: str, as_json: bool, call: Callable[[], Outcome]) -> None:
    """Run a rollout call; an abort (exit 10) prints the same document with its error, then fails."""
    from registry.release.rollout import Outcome, RolloutAborted

    try:
        out = call()
    except RolloutAborted as e:
        if isinstance(e.outcome, Outcome):
            Output(as_json).result(_doc(name, alias, e.outcome), _human(e.outcome), failure=e)
            raise ReportedFailure(e) from None
        raise
    Output(as_json).result(_doc(name, alias, out), _human(out))


alias_option = click.option("--alias", default="production", show_default=True, help="Alias under rollout.")
message_option = click.option("-m", "--message", help="Why (recorded in the history).")


@click.group("rollout")
def rollout_group() -> None:
    """Staged release: a new version takes a growing share of an alias's traffic, gated at every step.

    \b
    While a rollout of `production` runs, `production` still leads to the stable version and
    `production-canary` to the new one; the canary's weight is recorded beside the alias and
    changed by compare-and-swap. Each step checks the gates, records the weight, then runs the
    apply command (MREG_NAME, MREG_ALIAS, MREG_STABLE_VERSION, MREG_CANARY_VERSION,
    MREG_CANARY_WEIGHT, MREG_STABLE_PATH, MREG_CANARY_PATH in its environment, the rollout's
    state as JSON on its stdin). The last step flips the alias as `promote` does; a failing
    gate or apply aborts (weight 0, canary alias removed) and exits 10.
    """


@rollout_group.command("start")
@click.argument("ref", metavar="NAME@VERSION")
@alias_option
@click.option("--steps", metavar="W,W,…,100", help="Canary weights in percent, rising strictly to 100.")
@click.option("--interval", metavar="DURATION", help="Wait between steps for `run` (30s, 10m, 1h; default 0).")
@click.option("--gate", "gates", multiple=True, metavar="GATE",
              help="Checked before every step (repeatable): prom:URL|PROMQL|<0.05[|for=30s], http:URL, "
                   "check:GOLDEN.")
@click.option("--apply", "apply_cmd", metavar="CMD", help="Run (sh -c) after every weight change to apply it.")
@click.option("--apply-target", metavar="TARGET", help="Give the apply command `rollout render --target TARGET` "
                                                       "on its stdin (default: the rollout's state as JSON).")
@click.option("--expect", metavar="VERSION|none", help="Only if the alias currently points here (else exit 5).")
@click.option("--require", multiple=True, metavar="FORMAT[:ARGS]", help="As for `promote`: refuse a canary "
                                                                        "without it (exit 6).")
@click.option("--force", is_flag=True, help="Start even when the canary fails a promotion gate.")
@message_option
@config_option
@store_option
@json_option
def start_cmd(ref: str, alias: str, steps: str | None, interval: str | None, gates: tuple[str, ...],
              apply_cmd: str | None, apply_target: str | None, expect: str | None, require: tuple[str, ...],
              force: bool, message: str | None, config_path: str | None, store: str | None, as_json: bool) -> None:
    """Start rolling out NAME@VERSION against the version the alias points at now.

    Settings may also come from `[models.NAME.rollout]` in the config file (steps, interval,
    gates, apply). Bad steps, gates or URLs are usage errors (exit 2), a canary that failed
    verification a gate error (exit 6), an alias already under a rollout exit 5; nothing is
    written then.
    """
    settings = settings_for(config_path, store=store)
    expected = parse_expect(expect)
    name = ref.split("@", 1)[0]
    _report(name, alias, as_json, lambda: api.rollout_start(
        any_store(settings), ref, alias=alias, steps=steps, interval=interval, gates=gates, apply=apply_cmd,
        apply_target=apply_target, expect=expected, reason=message, require=require, force=force,
        policy=settings.raw, trust=api.trust_policy(settings, name)))


@rollout_group.command("status")
@click.argument("name")
@alias_option
@config_option
@store_option
@json_option
def status_cmd(name: str, alias: str, config_path: str | None, store: str | None, as_json: bool) -> None:
    """Show the alias's rollout: versions, weight, step, state (running, paused, done, aborted)."""
    check_name(name)
    st = any_store(settings_for(config_path, store=store))
    if not st.has_model(name):
        raise NotFound(f"model {name} does not exist", hint="run `mreg list` to see the models")
    rec = api.rollout_status(st, name, alias=alias)
    Output(as_json).result({"name": name, "alias": alias, "rollout": _record_doc(rec)}, _line(rec))


def _step_command(verb: str, help_text: str, act: Callable[..., Any]) -> None:
    """`mreg rollout VERB NAME [--alias A] [-m WHY]`: one change of a rollout's state, reported as a step is."""

    @rollout_group.command(verb, help=help_text)
    @click.argument("name")
    @alias_option
    @message_option
    @config_option
    @store_option
    @json_option
    def command(name: str, alias: str, message: str | None, config_path: str | None, store: str | None,
                as_json: bool) -> None:
        st = any_store(settings_for(config_path, store=store))
        _report(name, alias, as_json, lambda: act(st, name, alias=alias, reason=message))


for _verb, _help, _act in (
    ("advance", "Take the next step now (its gates checked first; a failing gate aborts, exit 10).",
     api.rollout_advance),
    ("pause", "Hold the rollout at its weight (a running `rollout run` stops at its next step).", api.rollout_pause),
    ("resume", "Let a paused rollout go on.", api.rollout_resume),
    ("abort", "Send all traffic back to the stable version: weight 0, canary alias removed, the alias untouched.",
     api.rollout_abort),
):
    _step_command(_verb, _help, _act)


@rollout_group.command("run")
@click.argument("name")
@alias_option
@config_option
@store_option
@json_option
def run_cmd(name: str, alias: str, config_path: str | None, store: str | None, as_json: bool) -> None:
    """Drive every remaining step: wait the interval (watching the gates), check them, apply the next weight,
    until the alias flips or a gate fails (automatic abort, exit 10). Started again after a kill, it goes on
    from the recorded step."""
    st = any_store(settings_for(config_path, store=store))

    def progress(out: Outcome) -> None:
        if out.record is not None:
            sys.stderr.write(_line(out.record) + "\n")

    _report(name, alias, as_json, lambda: api.rollout_run(st, name, alias=alias, on_step=progress))


@rollout_group.command("render")
@click.argument("name")
@alias_option
@click.option("--target", required=True, metavar="TARGET",
              help="gateway-api, inference-extension (alpha), kserve, argo-rollouts, flagger, seldon, haproxy, "
                   "nginx, llama-cpp, triton, json.")
@click.option("--port", default=8080, show_default=True, help="The engines' port (Kubernetes targets).")
@click.option("--stable-addr", default="stable:8080", show_default=True, help="host:port (haproxy, nginx).")
@click.option("--canary-addr", default="canary:8080", show_default=True, help="host:port (haproxy, nginx).")
@config_option
@store_option
@json_option
def render_cmd(name: str, alias: str, target: str, port: int, stable_addr: str, canary_addr: str,
               config_path: str | None, store: str | None, as_json: bool) -> None:
    """Write what a router needs for the rollout's current step: Kubernetes resources as YAML, router
    configuration as text (with --json: one document holding either)."""
    import yaml

    st = any_store(settings_for(config_path, store=store))
    out = api.rollout_render(st, name, target, alias=alias, port=port, stable_addr=stable_addr,
                             canary_addr=canary_addr)
    if isinstance(out, str):
        Output(as_json).result({"name": name, "alias": alias, "target": target, "text": out}, out)
    elif isinstance(out, list):
        Output(as_json).result({"name": name, "alias": alias, "target": target, "resources": out},
                               lambda: yaml.safe_dump_all(out, sort_keys=False))
    else:
        Output(as_json).result({"name": name, "alias": alias, "target": target, "document": out},
                               lambda: json.dumps(out, indent=2))
