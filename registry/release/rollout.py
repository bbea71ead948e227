"""Staged rollouts: a canary version takes a growing share of an alias's traffic, gated at every step.

While a rollout of `production` runs, `production` still leads to the stable version and `production-canary`
to the new one. The canary's weight lives in the alias's rollout record (a file beside the aliases locally, a field
of the alias record on S3), changed by the same compare-and-swap as the alias and logged in its history. A step is:
check the gates, write the weight (the commit point), run the apply command. A crash between the two is repaired
by `settle`, which runs the apply again for the recorded weight. The last step flips the alias as `promote` does;
an abort puts the weight back to 0. After either, the canary alias goes.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from manifests import GateResult, HistoryEntry, RolloutRecord, RolloutStep
from registry import layout, provenance
from registry.config import model_table
from registry.errors import Conflict, EngineNotReady, GateRefused, MregError, NotFound, UsageError
from registry.refs import check_alias, check_name
from registry.release import hooks
from registry.release.gates import check_gates
from registry.release.probes import Gate, Probing, evaluate, parse_duration, parse_gate
from registry.store.protocol import HistoryLoader, RolloutChange, Store, Version
from registry.store.trust import TrustPolicy

ACTIVE = ("running", "paused")
#: How long one apply command may run.
APPLY_TIMEOUT_S = 60.0
MAX_STEPS = 100


class RolloutAborted(EngineNotReady):
    """A gate failed or the apply command did: the rollout was aborted (weight 0, canary alias removed)."""


@dataclass(frozen=True)
class Outcome:
    """What one rollout command did: the record now, the gates it checked, what the apply said."""

    record: RolloutRecord | None
    changed: bool
    gates: tuple[GateResult, ...] = ()
    applied: str = ""
    steps: tuple[RolloutRecord, ...] = field(default=())


def parse_steps(text: str | Sequence[int]) -> tuple[int, ...]:
    """`5,25,50,100` → (5, 25, 50, 100): whole percentages rising strictly to 100 (a UsageError otherwise)."""
    hint = "e.g. --steps 5,25,50,100 (whole percentages, rising, the last one 100)"
    try:
        steps = tuple(int(s) for s in text.split(",")) if isinstance(text, str) else tuple(text)
    except ValueError:
        raise UsageError(f"--steps {str(text)[:80]!r} is not a list of whole percentages", hint=hint) from None
    if not steps or len(steps) > MAX_STEPS or any(isinstance(s, bool) or not isinstance(s, int) for s in steps):
        raise UsageError(f"--steps {str(text)[:80]!r}: give 1 to {MAX_STEPS} percentages", hint=hint)
    if steps[-1] != 100 or steps[0] < 1 or any(b <= a for a, b in itertools.pairwise(steps)):
        raise UsageError(f"--steps {','.join(map(str, steps))[:80]} do not rise strictly from above 0 to 100",
                         hint=hint)
    return steps


@dataclass(frozen=True)
class Plan:
    """A rollout's settings, parsed and checked before anything is written."""

    steps: tuple[int, ...]
    interval_s: float
    gates: tuple[Gate, ...]
    apply: str | None
    apply_target: str | None = None


def plan(steps: str | Sequence[int], interval: str | float = 0.0, gates: Sequence[str] = (),
         apply: str | None = None, apply_target: str | None = None) -> Plan:
    """Check every setting of a rollout (steps, interval, gates, apply command) before it starts."""
    seconds = parse_duration(interval, "--interval") if isinstance(interval, str) else float(interval)
    if not 0 <= seconds <= 7 * 24 * 3600:
        raise UsageError(f"--interval {interval!r} is not a number of seconds from 0 to a week", hint="e.g. 10m")
    command = None
    if apply is not None:
        command = str(hooks.check_settings({"reload_cmd": apply}, lambda _f: "--apply")["reload_cmd"])
    from registry.release.routers import TARGETS

    if apply_target is not None and apply_target not in TARGETS:
        raise UsageError(f"--apply-target {apply_target[:40]!r} is no render target",
                         hint=f"known: {', '.join(TARGETS)}")
    return Plan(parse_steps(steps), seconds, tuple(parse_gate(g) for g in gates), command, apply_target)


#: `[models.NAME.rollout]` keys.
CONFIG_KEYS = ("steps", "interval", "gates", "apply", "apply_target")


def configured(raw: dict[str, Any], name: str) -> dict[str, Any]:
    """The config file's `[models.NAME.rollout]` table (steps, interval, gates, apply), its types checked."""
    conf = model_table(raw, name).get("rollout", {})
    where = f"[models.{name}.rollout]"
    if not isinstance(conf, dict):
        raise UsageError(f"{where} in the config file is not a table", hint="e.g. steps = [5, 25, 100]")
    unknown = set(conf) - set(CONFIG_KEYS)
    if unknown:
        raise UsageError(f"unknown keys in {where}: {', '.join(sorted(unknown))}",
                         hint=f"known keys: {', '.join(CONFIG_KEYS)}")
    kinds: dict[str, tuple[type, ...]] = {"steps": (list, str), "interval": (str, int, float), "gates": (list,),
                                          "apply": (str,), "apply_target": (str,)}
    for key, value in conf.items():
        if isinstance(value, bool) or not isinstance(value, kinds[key]) or (
                isinstance(value, list) and not all(isinstance(g, str if key == "gates" else int) for g in value)):
            raise UsageError(f"{where} {key} has the wrong type", hint='e.g. steps = [5, 25, 100], interval = "10m", '
                                                                      'gates = ["http:http://canary/health"], '
                                                                      'apply = "my-router-apply"')
    return conf


def _entry(alias: str, action: str, frm: int, to: int, rec: RolloutRecord, reason: str | None,
           gates: Sequence[GateResult] = ()) -> HistoryEntry:
    return HistoryEntry.model_validate({
        "alias": alias, "action": action, "from": frm, "to": to, "reason": reason, "by": provenance.now(),
        "rollout": RolloutStep(stable=rec.stable, canary=rec.canary, weight=rec.weight, step=rec.step,
                               gates=tuple(gates))})


def _changed(rec: RolloutRecord, **update: object) -> RolloutRecord:
    return RolloutRecord.model_validate({**rec.model_dump(), **update, "changed": provenance.now()})


def _names(name: str, alias: str) -> str:
    check_name(name)
    check_alias(alias)
    canary = layout.canary_alias(alias)
    if len(canary) > 64:
        raise UsageError(f"alias {alias} is too long for a rollout: {canary} would pass 64 characters",
                         hint="roll out a shorter alias")
    return canary


def start(store: Store, name: str, version: Version, p: Plan, *, alias: str = "production",
          expect: int | str | None = "", reason: str | None = None, require: Sequence[str] = (),
          trust: TrustPolicy | None = None, force: bool = False) -> Outcome:
    """Start a rollout of `version` against the alias's current version: record weight 0, point the canary alias
    at the version, run the apply command for weight 0. Refused (nothing written) for a version that is already the
    stable one, one that fails its gates, or an alias under a rollout already (exit 5)."""
    canary = _names(name, alias)
    problems = check_gates(version, require, store, trust)
    if problems and not force:
        raise GateRefused(f"{name}@{version.number} may not be rolled out: {'; '.join(problems)}",
                          hint="fix the version, or pass --force to roll it out anyway")

    def decide(current: int | None, before: RolloutRecord | None, _h: HistoryLoader) -> RolloutChange:
        if current is None:
            raise NotFound(f"{name} has no alias {alias}: a rollout needs a stable version to start from",
                           hint=f"promote one first: `mreg promote {name}@VERSION --alias {alias}`")
        if expect != "" and current != expect:
            raise Conflict(f"{name} {alias} is {current}, not {expect if expect is not None else 'unset'} as "
                           "expected; nothing changed", hint=f"run `mreg history {name}` and retry")
        if before is not None and before.state in ACTIVE:
            raise Conflict(f"{name} {alias} is already under a rollout of {before.canary} ({before.state}, at "
                           f"{before.weight}%); nothing changed",
                           hint=f"see `mreg rollout status {name} --alias {alias}`; abort it first")
        if current == version.number:
            raise UsageError(f"{name}@{version.number} is already the stable version of {alias}",
                             hint="roll out a newer version")
        store.version(name, version.number)
        by = provenance.now()
        rec = RolloutRecord(name=name, alias=alias, stable=current, canary=version.number, steps=p.steps, step=-1,
                            weight=0, state="running", applied=p.apply is None, interval_s=p.interval_s,
                            gates=tuple(g.text for g in p.gates), apply=p.apply, apply_target=p.apply_target,
                            reason=reason, started=by,
                            changed=by)
        return RolloutChange(rec, _entry(alias, "rollout-start", current, current, rec, reason))

    _c, _b, change = store.transact_rollout(name, alias, decide)
    assert change is not None
    store.point_alias(name, canary, version.number)
    return _finish_apply(store, change.record, ())


def status(store: Store, name: str, alias: str = "production") -> RolloutRecord | None:
    """The alias's rollout record (None when it never had one)."""
    _names(name, alias)
    return store.rollout(name, alias)


def _active(store: Store, name: str, alias: str) -> RolloutRecord:
    rec = store.rollout(name, alias)
    if rec is None or rec.state not in ACTIVE:
        raise NotFound(f"{name} {alias} has no rollout running" + (f" (the last one is {rec.state})" if rec else ""),
                       hint=f"start one with `mreg rollout start {name}@VERSION --alias {alias} --steps 5,25,100`")
    return rec


def _transition(store: Store, rec: RolloutRecord, action: str, reason: str | None, *,
                gates: Sequence[GateResult] = (), accept: Sequence[str] = ACTIVE, **update: object) -> RolloutRecord:
    """Write one step of the rollout if nobody moved it since `rec` was read (else Conflict, exit 5)."""
    def decide(current: int | None, before: RolloutRecord | None, _h: HistoryLoader) -> RolloutChange:
        if before is None or (before.step, before.state, before.canary) != (rec.step, rec.state, rec.canary) \
                or before.state not in accept:
            raise Conflict(f"the rollout of {rec.name} {rec.alias} was changed by another writer "
                           f"(now {before.state + ' at ' + str(before.weight) + '%' if before else 'gone'}); "
                           "nothing changed", hint=f"see `mreg rollout status {rec.name} --alias {rec.alias}`")
        new = _changed(before, **update)
        frm = current if current is not None else rec.stable
        to = new.canary if new.state == "done" else frm
        return RolloutChange(new, _entry(rec.alias, action, frm, to, new, reason, gates))

    _c, _b, change = store.transact_rollout(rec.name, rec.alias, decide)
    assert change is not None
    return change.record


def env_for(store: Store, rec: RolloutRecord) -> dict[str, str]:
    """What the apply command sees: the versions, the canary's weight, the mount paths (as `resolve` gives them)."""
    canary_alias = layout.canary_alias(rec.alias)
    return {"MREG_NAME": rec.name, "MREG_ALIAS": rec.alias, "MREG_STABLE_VERSION": str(rec.stable),
            "MREG_CANARY_VERSION": str(rec.canary), "MREG_CANARY_WEIGHT": str(rec.weight),
            "MREG_STABLE_PATH": store.alias_mount(rec.name, rec.alias) or "",
            "MREG_CANARY_PATH": store.alias_mount(rec.name, canary_alias) or "",
            "MREG_ROLLOUT_STATE": rec.state, "MREG_STORE": store.location}


def router_document(store: Store, rec: RolloutRecord) -> bytes:
    """The apply command's standard input: `rollout render --target T` for the record's apply target (Kubernetes
    resources as YAML, router configuration as text), else the rollout's state as one JSON document."""
    from registry.release import routers

    out = routers.render(store, rec, rec.apply_target or "json")
    if isinstance(out, str):
        return out.encode()
    if isinstance(out, list):
        import yaml

        return str(yaml.safe_dump_all(out, sort_keys=False)).encode()
    return json.dumps(out, indent=2).encode() + b"\n"


def _apply(store: Store, rec: RolloutRecord) -> tuple[bool, str]:
    if rec.apply is None:
        return True, ""
    try:
        code, tail = hooks.run_command(rec.apply, env_for(store, rec), APPLY_TIMEOUT_S, router_document(store, rec))
    except Exception as e:  # noqa: BLE001 - whatever stops the apply is its failure, reported as such
        return False, f"apply failed: {type(e).__name__}: {e}"
    if code == 0:
        return True, f"apply exited 0 for weight {rec.weight}"
    what = f"apply command did not finish within {APPLY_TIMEOUT_S:g}s" if code is None else f"apply exited {code}"
    return False, f"{what} for weight {rec.weight}" + (f": {tail}" if tail else "")


def _mark_applied(store: Store, rec: RolloutRecord) -> RolloutRecord:
    def decide(_c: int | None, before: RolloutRecord | None, _h: HistoryLoader) -> RolloutChange | None:
        if before is None or (before.step, before.state, before.weight) != (rec.step, rec.state, rec.weight):
            return None  # moved on meanwhile: the next writer applies its own weight
        return RolloutChange(before.model_copy(update={"applied": True}), None)

    _c, _b, change = store.transact_rollout(rec.name, rec.alias, decide)
    return change.record if change else rec


def _finish_apply(store: Store, rec: RolloutRecord, gates: Sequence[GateResult]) -> Outcome:
    """After a commit: run the apply for the recorded weight; on failure abort (a running rollout) or report;
    once a rollout is over, remove the canary alias."""
    ok, said = _apply(store, rec)
    if ok:
        if rec.apply is not None:
            rec = _mark_applied(store, rec)
        if rec.state not in ACTIVE:
            store.drop_alias(rec.name, layout.canary_alias(rec.alias))
        return Outcome(rec, True, tuple(gates), said)
    if rec.state in ACTIVE:
        aborted = _transition(store, rec, "rollout-abort", f"automatic abort: {said}", weight=0, state="aborted",
                              applied=False)
        back_ok, back = _apply(store, aborted)
        if back_ok:
            aborted = _mark_applied(store, aborted)
            store.drop_alias(rec.name, layout.canary_alias(rec.alias))
        err = RolloutAborted(
            f"{rec.name} {rec.alias}: {said}; the rollout of {rec.canary} was aborted (weight 0)"
            + ("" if back_ok else f", and the apply for weight 0 failed too ({back})"),
            hint=f"fix the apply command; see `mreg history {rec.name} --alias {rec.alias}`")
        err.outcome = Outcome(aborted, True, tuple(gates), said)
        raise err
    raise MregError(f"{rec.name} {rec.alias}: the rollout is {rec.state} but {said}",
                    hint=f"fix the router, then run `mreg rollout status {rec.name} --alias {rec.alias}` "
                         "(it runs the apply again for the recorded weight)")


def settle(store: Store, name: str, alias: str = "production") -> RolloutRecord | None:
    """Repair what a crash between a commit and its apply left: run the apply again for the recorded weight, point
    (or remove) the canary alias as the record says, finish a last step's flip. Returns the record."""
    rec = store.rollout(name, alias)
    if rec is None:
        return None
    canary_alias = layout.canary_alias(alias)
    if rec.state == "done" and store.alias(name, alias) != rec.canary:
        rec = _repair_flip(store, rec)
    if rec.state in ACTIVE and store.alias(name, canary_alias) != rec.canary:
        store.point_alias(name, canary_alias, rec.canary)
    if not rec.applied:
        rec = _finish_apply(store, rec, ()).record or rec
    elif rec.state not in ACTIVE and store.alias(name, canary_alias) is not None:
        store.drop_alias(name, canary_alias)
    return rec


def _repair_flip(store: Store, rec: RolloutRecord) -> RolloutRecord:
    def decide(current: int | None, before: RolloutRecord | None, _h: HistoryLoader) -> RolloutChange | None:
        if before != rec or current == rec.canary:
            return None
        return RolloutChange(before, _entry(rec.alias, "rollout-done", current if current is not None else rec.stable,
                                            rec.canary, rec, "repair: the last step's flip was interrupted"))

    store.transact_rollout(rec.name, rec.alias, decide)
    return store.rollout(rec.name, rec.alias) or rec


def check(store: Store, rec: RolloutRecord, probing: Probing, *, hold: bool = True,
          sleep: Callable[[float], None] = time.sleep) -> tuple[GateResult, ...]:
    """Evaluate the rollout's gates now (a Prometheus gate is skipped while the canary has no traffic yet)."""
    canary = store.version(rec.name, rec.canary)
    out = []
    for text in rec.gates:
        gate = parse_gate(text)
        if gate.kind == "prom" and rec.weight == 0:
            out.append(GateResult(gate=text, passed=True, detail="skipped: the canary has no traffic before the "
                                                                 "first step"))
            continue
        out.append(evaluate(gate, store, canary, probing, hold=hold, sleep=sleep))
        if not out[-1].passed:
            break
    return tuple(out)


def advance(store: Store, name: str, alias: str = "production", *, probing: Probing | None = None,
            reason: str | None = None, sleep: Callable[[float], None] = time.sleep) -> Outcome:
    """The next step now: the gates checked, the next weight written, the apply run; the last step flips the alias.
    A failing gate aborts the rollout (RolloutAborted, exit 10)."""
    _names(name, alias)
    settle(store, name, alias)
    rec = _active(store, name, alias)
    if rec.state == "paused":
        raise Conflict(f"the rollout of {name} {alias} is paused", hint=f"run `mreg rollout resume {name}`")
    results = check(store, rec, probing or Probing(), sleep=sleep)
    failed = next((g for g in results if not g.passed), None)
    if failed is not None:
        return _gate_abort(store, rec, failed, results)
    nxt = rec.step + 1
    weight = rec.steps[nxt]
    last = nxt == len(rec.steps) - 1
    new = _transition(store, rec, "rollout-done" if last else "rollout-step", reason, gates=results, step=nxt,
                      weight=weight, state="done" if last else "running", applied=rec.apply is None)
    return _finish_apply(store, new, results)


def _gate_abort(store: Store, rec: RolloutRecord, failed: GateResult, results: Sequence[GateResult]) -> Outcome:
    value = f" (value {failed.value:g})" if failed.value is not None else ""
    why = f"gate {failed.gate} failed{value}: {failed.detail}"
    aborted = _transition(store, rec, "rollout-abort", f"automatic abort: {why}", gates=results, weight=0,
                          state="aborted", applied=rec.apply is None)
    outcome = _finish_apply(store, aborted, results)
    err = RolloutAborted(f"{rec.name} {rec.alias}: {why}; the rollout of {rec.canary} was aborted at "
                         f"{rec.weight}%, all traffic is back on {rec.stable}",
                         hint=f"see `mreg history {rec.name} --alias {rec.alias}`; fix the version and start again")
    err.outcome = outcome
    raise err


def pause(store: Store, name: str, alias: str = "production", reason: str | None = None) -> Outcome:
    """Hold the rollout at its weight (a `run` stops at its next step)."""
    return _set_state(store, name, alias, "paused", "rollout-pause", reason)


def resume(store: Store, name: str, alias: str = "production", reason: str | None = None) -> Outcome:
    """Let a paused rollout go on."""
    return _set_state(store, name, alias, "running", "rollout-resume", reason)


def _set_state(store: Store, name: str, alias: str, state: Literal["running", "paused"],
               action: Literal["rollout-pause", "rollout-resume"], reason: str | None) -> Outcome:
    """The active rollout in `state` (one history entry), or unchanged when it already is."""
    _names(name, alias)
    rec = _active(store, name, alias)
    if rec.state == state:
        return Outcome(rec, False)
    return Outcome(_transition(store, rec, action, reason, state=state), True)


def abort(store: Store, name: str, alias: str = "production", reason: str | None = None) -> Outcome:
    """The canary's weight back to 0, the apply run, the canary alias removed; the stable alias is not touched."""
    _names(name, alias)
    rec = _active(store, name, alias)
    aborted = _transition(store, rec, "rollout-abort", reason, weight=0, state="aborted", applied=rec.apply is None)
    return _finish_apply(store, aborted, ())


def abort_for(store: Store, name: str, alias: str, what: str) -> Outcome | None:
    """`promote --force` / `rollback --force` of an alias under a rollout: abort the rollout first (None: none)."""
    rec = store.rollout(name, alias)
    if rec is None or rec.state not in ACTIVE:
        return None
    return abort(store, name, alias, f"aborted by {what} --force")


def run(store: Store, name: str, alias: str = "production", *, probing: Probing | None = None,
        sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.time,
        on_step: Callable[[Outcome], None] | None = None) -> Outcome:
    """Drive every remaining step: wait the interval (watching the gates meanwhile), check them, apply the next
    weight, until the alias flips or a gate fails (RolloutAborted, exit 10). A killed `run` started again goes on
    from the recorded step, waiting only what is left of the interval."""
    _names(name, alias)
    probing = probing or Probing()
    last = settle(store, name, alias)
    if last is not None and last.state == "done":
        return Outcome(last, False)  # a `run` started again after the last step: nothing is left to do
    taken: list[RolloutRecord] = []
    while True:
        rec = _active(store, name, alias)
        if rec.state == "paused":
            return Outcome(rec, bool(taken), steps=tuple(taken))
        if rec.step >= 0:
            due = rec.changed.at.timestamp() + rec.interval_s
            while due - clock() > 0:
                if rec.weight > 0 and rec.gates:  # watch: a canary that fails mid-interval is aborted at once
                    watched = check(store, rec, probing, hold=False, sleep=sleep)
                    failed = next((g for g in watched if not g.passed), None)
                    if failed is not None:
                        return _gate_abort(store, rec, failed, watched)
                sleep(min(probing.poll_s, max(0.0, due - clock())))
                now = store.rollout(name, alias)
                if now is None or (now.step, now.state) != (rec.step, rec.state):
                    break  # paused, advanced or aborted by someone else: look again
            if (now := store.rollout(name, alias)) is None or (now.step, now.state) != (rec.step, rec.state):
                continue
        done = advance(store, name, alias, probing=probing, sleep=sleep)
        if done.record is not None:
            taken.append(done.record)
        if on_step is not None:
            on_step(done)
        if done.record is None or done.record.state != "running":
            return Outcome(done.record, True, done.gates, done.applied, tuple(taken))
