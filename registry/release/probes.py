"""A rollout's gates, checked before every step: a Prometheus query held within a bound, an HTTP probe, a golden set.

Gate syntax (`--gate`, or `gates = [...]` under `[models.NAME.rollout]`)::

    prom:URL|PROMQL|OP THRESHOLD[|for=DURATION]   every sample of the query within the bound for DURATION
    http:URL                                      the URL answers 2xx
    check:GOLDEN                                  the canary's latest check of golden set GOLDEN passed

The PromQL expression may itself hold `|` (a regex matcher): the URL is cut at the first `|`, the bound and
`for=` at the last ones. An endpoint that cannot be reached, an answer that is not Prometheus's, or a query with no
data (or NaN: a ratio over no traffic) is retried a bounded number of times, then counts as failing, never passing.
"""

from __future__ import annotations

import json
import math
import operator
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from manifests import GateResult
from registry.errors import UsageError
from registry.release import hooks
from registry.release.check import check_problems
from registry.store.protocol import Store, Version

KINDS = ("prom", "http", "check")
OPS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "==": operator.eq, "!=": operator.ne, "<": operator.lt, ">": operator.gt}
_BOUND_RE = re.compile(r"\A\s*(<=|>=|==|!=|<|>)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*\Z")
_DURATION_RE = re.compile(r"\A(\d+(?:\.\d+)?)(ms|s|m|h)?\Z")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
#: A step's interval or a gate's hold beyond a week is a typo.
MAX_DURATION_S = 7 * 24 * 3600.0
MAX_GATE = 4096
_GATE_HINT = ("e.g. --gate 'prom:http://127.0.0.1:9090|sum(rate(errors[1m]))/sum(rate(requests[1m]))|<0.05|for=30s'"
              ", --gate http://canary:8080/health as http:URL, or --gate check:smoke")


def parse_duration(text: str, where: str) -> float:
    """`30s`, `10m`, `1h`, `500ms` or a number of seconds → seconds (a UsageError naming `where` otherwise)."""
    m = _DURATION_RE.match(text.strip()) if isinstance(text, str) else None
    if m is None:
        raise UsageError(f"{where} {str(text)[:40]!r} is not a duration", hint=f"e.g. {where} 30s (ms, s, m, h)")
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds > MAX_DURATION_S:
        raise UsageError(f"{where} {text} is longer than a week", hint=f"e.g. {where} 10m")
    return seconds


@dataclass(frozen=True)
class Gate:
    """One parsed gate; `text` is what the user gave (recorded in the history with its value)."""

    kind: str
    text: str
    url: str = ""
    query: str = ""
    op: str = ""
    threshold: float = 0.0
    hold_s: float = 0.0
    golden: str = ""


def parse_gate(text: str) -> Gate:
    """A gate from its text; a UsageError for an unknown kind, a malformed URL, PromQL bound or duration."""
    if not isinstance(text, str) or not text or len(text) > MAX_GATE or "\0" in text:
        raise UsageError(f"bad gate {str(text)[:80]!r}: not a gate of at most {MAX_GATE} characters", hint=_GATE_HINT)
    kind, sep, rest = text.partition(":")
    if rest.startswith("//"):  # `--gate http://host/health`: a URL where a gate was meant
        raise UsageError(f"gate {text[:80]!r} is a URL with no gate kind before it",
                         hint=f"write http:{text[:60]} for an HTTP probe; " + _GATE_HINT)
    if not sep or kind not in KINDS:
        raise UsageError(f"unknown gate kind {kind[:20]!r} in {text[:80]!r}", hint=f"known kinds: {', '.join(KINDS)}; "
                                                                                   + _GATE_HINT)
    if kind == "http":
        return Gate(kind, text, url=_url(rest, text))
    if kind == "check":
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", rest):
            raise UsageError(f"gate {text[:80]!r} names no golden set", hint="e.g. --gate check:smoke")
        return Gate(kind, text, golden=rest)
    url, sep, tail = rest.partition("|")
    if not sep:
        raise UsageError(f"gate {text[:80]!r} has no PromQL query", hint=_GATE_HINT)
    hold = 0.0
    head, sep, last = tail.rpartition("|")
    if sep and last.strip().startswith("for="):
        hold = parse_duration(last.strip()[4:], "for=")
        tail = head
    query, sep, bound = tail.rpartition("|")
    m = _BOUND_RE.match(bound) if sep else None
    if m is None:
        raise UsageError(f"gate {text[:80]!r}: no bound such as '<0.05' after the query", hint=_GATE_HINT)
    if not query.strip():
        raise UsageError(f"gate {text[:80]!r} has an empty PromQL query", hint=_GATE_HINT)
    if query.count("(") != query.count(")") or query.count("{") != query.count("}") or query.count(
            "[") != query.count("]"):
        raise UsageError(f"gate {text[:80]!r}: the PromQL query's brackets do not match", hint=_GATE_HINT)
    threshold = float(m.group(2))
    if not math.isfinite(threshold):  # 1e999 is inf: a bound every sample meets is no gate
        raise UsageError(f"gate {text[:80]!r}: the bound {m.group(2)[:20]} is not a finite number", hint=_GATE_HINT)
    return Gate(kind, text, url=_url(url, text), query=query.strip(), op=m.group(1), threshold=threshold,
                hold_s=hold)


def _url(value: str, text: str) -> str:
    return str(hooks.check_settings({"ready_url": value}, lambda _f: f"gate {text[:60]!r}: URL")["ready_url"])


@dataclass(frozen=True)
class Probing:
    """How hard a gate tries: `tries` samples before no data or no answer counts as failing, `retry_s` between
    them, `poll_s` between the samples of a hold, `timeout_s` per request."""

    tries: int = 3
    retry_s: float = 1.0
    poll_s: float = 1.0
    timeout_s: float = 5.0


class _NoData(Exception):
    """The endpoint did not answer, answered what is not Prometheus's, or the query returned no number."""


def evaluate(gate: Gate, store: Store, canary: Version, probing: Probing, *, hold: bool = True,
             clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> GateResult:
    """Check one gate now (a Prometheus bound held for its duration when `hold`); never raises for the gate's
    failure, only reports it."""
    if gate.kind == "check":
        problems = check_problems(store, canary, f"check:{gate.golden}")
        return GateResult(gate=gate.text, passed=not problems, detail="; ".join(problems))
    if gate.kind == "http":
        last = ""
        for attempt in range(probing.tries):
            ok, last = hooks.probe(gate.url, "GET", probing.timeout_s)
            if ok:
                return GateResult(gate=gate.text, passed=True, detail=last)
            if attempt + 1 < probing.tries:
                sleep(probing.retry_s)
        return GateResult(gate=gate.text, passed=False, detail=f"{last} after {probing.tries} tries")
    end = clock() + (gate.hold_s if hold else 0.0)
    while True:
        try:
            values = _sample(gate, probing, sleep)
        except _NoData as e:
            return GateResult(gate=gate.text, passed=False, detail=f"{e} after {probing.tries} tries")
        bad = [v for v in values if not OPS[gate.op](v, gate.threshold)]
        if bad:
            return GateResult(gate=gate.text, passed=False, value=bad[0],
                              detail=f"{bad[0]:g} is not {gate.op} {gate.threshold:g}")
        if clock() >= end:
            return GateResult(gate=gate.text, passed=True, value=values[0],
                              detail=f"{values[0]:g} {gate.op} {gate.threshold:g}"
                                     + (f" for {gate.hold_s:g}s" if hold and gate.hold_s else ""))
        sleep(min(probing.poll_s, max(0.0, end - clock())))


def _sample(gate: Gate, probing: Probing, sleep: Callable[[float], None]) -> list[float]:
    why = ""
    for attempt in range(probing.tries):
        try:
            return _query(gate, probing.timeout_s)
        except _NoData as e:
            why = str(e)
        if attempt + 1 < probing.tries:
            sleep(probing.retry_s)
    raise _NoData(why)


#: A Prometheus answer is a small JSON document; more is not one.
MAX_ANSWER = 1 << 20


def _query(gate: Gate, timeout: float) -> list[float]:
    url = gate.url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": gate.query})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            doc = json.loads(r.read(MAX_ANSWER + 1)[:MAX_ANSWER])
    except urllib.error.HTTPError as e:
        raise _NoData(f"Prometheus answered HTTP {e.code}") from None
    except (OSError, ValueError) as e:
        raise _NoData(f"no answer from Prometheus ({type(e).__name__}: {getattr(e, 'reason', e)})") from None
    try:
        data = doc["data"]
        raw = [data["result"][1]] if data["resultType"] == "scalar" else [s["value"][1] for s in data["result"]]
        values = [float(v) for v in raw]
    except (KeyError, TypeError, IndexError, ValueError):
        raise _NoData("the answer is not a Prometheus query result") from None
    values = [v for v in values if not math.isnan(v)]
    if not values:
        raise _NoData("the query returned no data")
    return values
