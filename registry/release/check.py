"""Golden-set checks: run fixed cases through a version's artifact, judge, and keep an append-only record.

Records live beside the version, never inside it (the manifest stays immutable)::

    models/<name>/checks/<n>/<UTC time>-<golden name>-<golden sha256[:12]>.json   a CheckRecord
    models/<name>/baselines/<golden name>.json                                    a Baseline
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import platform
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from manifests import Artifact, Baseline, CaseResult, CheckRecord, GoldenCase
from registry import atomic, layout, provenance
from registry.convert import formats
from registry.convert.protocol import Session
from registry.errors import IntegrityError, NotFound, UsageError
from registry.inputs import decode_text, read_input
from registry.store import entries
from registry.store.local import LocalStore
from registry.store.protocol import Store, Version


@dataclass(frozen=True)
class GoldenSet:
    """A parsed golden file."""

    name: str
    sha256: str
    cases: tuple[GoldenCase, ...]


#: A golden set runs every case through the model: 16 MiB of prompts (thousands of long cases) is more than any
#: check is run on, and a wrong path (a checkpoint, /dev/zero) is refused before it fills memory.
MAX_GOLDEN = 16 << 20


def load_golden(path: Path) -> GoldenSet:
    """Parse a golden JSONL file; every problem is reported at once, with its line number."""
    hint = 'give a UTF-8 file of at most 16 MiB, one JSON case per line: {"id", "prompt"|"messages"|"text", "expect"}'
    raw = read_input(path, "--golden", limit=MAX_GOLDEN, hint=hint, missing=NotFound)
    cases, problems = [], []
    for i, line in enumerate(decode_text(raw, path, "--golden", hint=hint).splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            cases.append(GoldenCase.model_validate_json(line))
        except ValidationError as e:
            problems.append(f"line {i}: {'; '.join(err['msg'] for err in e.errors())}")
    ids = [c.id for c in cases]
    problems += [f"duplicate case id {d!r}" for d in sorted({i for i in ids if ids.count(i) > 1})]
    if problems or not cases:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        raise UsageError(f"{path} is not a valid golden file: " + (shown or "no cases"),
                         hint="one JSON object per line: {\"id\", \"prompt\"|\"messages\"|\"text\", \"expect\"}")
    return GoldenSet(path.stem, hashlib.sha256(raw).hexdigest(), tuple(cases))


def evaluate(case: GoldenCase, output: str | None, *, latency_ms: float, tokens_per_s: float | None,
             cosine: float | None, baseline_output: str | None) -> tuple[list[str], int, int]:
    """Judge one output (pure): (failures, keyword hits, keyword total). Keyword misses count toward the set's rate."""
    e = case.expect
    failures: list[str] = []
    text = output or ""
    low = text.lower()
    hits = sum(1 for k in e.contains if k.lower() in low)
    failures += [f"contains forbidden {k!r}" for k in e.not_contains if k.lower() in low]
    if e.regex is not None and not re.search(e.regex, text):
        failures.append(f"does not match /{e.regex}/")
    if e.json_ is not None and e.json_ is not False:
        try:
            doc = json.loads(text.strip())
        except ValueError:
            failures.append("output is not JSON")
        else:
            if isinstance(e.json_, dict):
                import jsonschema

                try:
                    jsonschema.validate(doc, e.json_)
                except jsonschema.ValidationError as err:
                    failures.append(f"JSON does not match the schema: {err.message}")
    if e.max_latency_ms is not None and latency_ms > e.max_latency_ms:
        failures.append(f"latency {latency_ms:.0f} ms > {e.max_latency_ms:g} ms")
    if e.min_tokens_per_s is not None and (tokens_per_s or 0) < e.min_tokens_per_s:
        failures.append(f"{tokens_per_s or 0:.1f} tokens/s < {e.min_tokens_per_s:g}")
    if e.min_cosine is not None and (cosine is None or not cosine >= e.min_cosine):
        failures.append(f"cosine {cosine if cosine is not None else 'n/a'} < {e.min_cosine:g} (against the baseline)")
    if e.baseline and baseline_output is not None and output is not None and output != baseline_output:
        failures.append(f"output differs from the baseline: {_short(output)!r} vs {_short(baseline_output)!r}")
    return failures, hits, len(e.contains)


def _short(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def artifact_for(version: Version, fmt: str | None) -> Artifact:
    """The artifact a check runs: the one of `fmt`, or the only/first runnable one."""
    arts = version.manifest.artifacts
    if fmt is not None:
        for a in arts:
            if a.format == fmt:
                return a
        raise NotFound(f"{version.name}@{version.number} has no {fmt} artifact",
                       hint=f"it has {', '.join(a.format for a in arts)}")
    for pref in formats.runnable():
        for a in arts:
            if a.format == pref:
                return a
    return arts[0]


def run_check(store: LocalStore, version: Version, golden: GoldenSet, *, fmt: str | None = None,
              min_keyword_hit_rate: float = 1.0, record_baseline: bool = False) -> CheckRecord:
    """Run every case, judge it, store the record (and the baseline when asked); returns the record."""
    art = artifact_for(version, fmt)
    baseline = None if record_baseline else load_baseline(store, version.name, golden)
    session = formats.get(art.format).open_session(Path(version.path) / art.path, art, version.manifest)
    results: list[CaseResult] = []
    outputs: dict[str, str] = {}
    embeddings: dict[str, tuple[float, ...]] = {}
    try:
        for case in golden.cases:
            # While recording a baseline, this run is the reference: it matches itself.
            results.append(_run_case(session, case, baseline, outputs, embeddings, record_baseline))
    finally:
        session.close()
    hits = sum(r.keyword_hits for r in results)
    total = sum(r.keyword_total for r in results)
    rate = hits / total if total else None
    latencies = sorted(r.latency_ms for r in results)
    tps = [r.tokens_per_s for r in results if r.tokens_per_s]
    passed = all(r.passed for r in results) and (rate is None or rate >= min_keyword_hit_rate)
    who = provenance.now()
    record = CheckRecord(
        name=version.name, version=version.number, manifest_sha256=version.manifest_sha256, golden=golden.name,
        golden_sha256=golden.sha256, format=art.format, runtime=session.runtime,
        runtime_version=session.runtime_version, hardware=_hardware(), passed=passed, keyword_hit_rate=rate,
        min_keyword_hit_rate=min_keyword_hit_rate, latency_p50_ms=round(statistics.median(latencies), 3),
        latency_p95_ms=round(_percentile(latencies, 95), 3), tokens_per_s=round(statistics.median(tps), 2) if tps
        else None, baseline_from=baseline.version if baseline else None, cases=tuple(results), at=who.at, by=who)
    _write_record(store, record)
    if record_baseline:
        save_baseline(store, Baseline(name=version.name, golden=golden.name, golden_sha256=golden.sha256,
                                      version=version.number, format=art.format, outputs=outputs,
                                      embeddings=embeddings, by=who))
    return record


def _run_case(session: Session, case: GoldenCase, baseline: Baseline | None, outputs: dict[str, str],
              embeddings: dict[str, tuple[float, ...]], recording: bool) -> CaseResult:
    if case.text is not None:
        prompt = case.text
    elif case.messages is not None:
        try:
            prompt = session.render_chat([m.template_input() for m in case.messages],
                                         None if case.tools is None else [dict(t) for t in case.tools])
        except UsageError as e:  # which case the template refused
            raise UsageError(f"case {case.id!r}: {e}", hint=e.hint) from e
    else:
        prompt = case.prompt or ""
    templated = case.messages is not None  # the template wrote the special tokens: none are added again
    n_prompt = session.count_tokens(prompt, templated=templated)
    limit = session.context_length
    if limit is not None and n_prompt + (0 if case.text is not None else case.max_new_tokens) > limit:
        return CaseResult(id=case.id, passed=False, prompt_tokens=n_prompt, latency_ms=0.0, failures=(
            f"prompt is {n_prompt} tokens; with max_new_tokens {case.max_new_tokens} it exceeds the model's "
            f"context of {limit} tokens",))
    if case.text is not None:
        emb = session.embed(prompt)
        embeddings[case.id] = emb.vector
        ref = baseline.embeddings.get(case.id) if baseline else None
        cosine = _cosine(emb.vector, ref) if ref else (1.0 if recording else None)
        failures, hits, total = evaluate(case, None, latency_ms=emb.seconds * 1000, tokens_per_s=None,
                                         cosine=cosine, baseline_output=None)
        if ref is not None and case.expect.baseline and case.expect.min_cosine is None and cosine is not None \
                and not cosine >= 0.999:  # NaN fails too
            failures.append(f"embedding moved from the baseline: cosine {cosine:.5f} < 0.999")
        return CaseResult(id=case.id, passed=not failures, prompt_tokens=emb.prompt_tokens,
                          latency_ms=round(emb.seconds * 1000, 3), cosine=cosine,
                          embedding_sha256=hashlib.sha256(json.dumps(emb.vector).encode()).hexdigest(),
                          failures=tuple(failures))
    gen = session.generate(prompt, case.max_new_tokens, templated=templated)
    outputs[case.id] = gen.text
    tps = gen.output_tokens / gen.seconds if gen.seconds > 0 and gen.output_tokens else None
    failures, hits, total = evaluate(case, gen.text, latency_ms=gen.seconds * 1000, tokens_per_s=tps, cosine=None,
                                     baseline_output=baseline.outputs.get(case.id) if baseline else None)
    return CaseResult(id=case.id, passed=not failures, output=gen.text, prompt_tokens=n_prompt,
                      output_tokens=gen.output_tokens, latency_ms=round(gen.seconds * 1000, 3),
                      tokens_per_s=round(tps, 2) if tps else None, keyword_hits=hits, keyword_total=total,
                      failures=tuple(failures))


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


def _percentile(sorted_values: list[float], p: float) -> float:
    k = (len(sorted_values) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def _hardware() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu} x{os.cpu_count()}"


def _write_record(store: LocalStore, record: CheckRecord) -> Path:
    d = layout.checks_dir(store.root, record.name, record.version)
    d.mkdir(parents=True, exist_ok=True)
    stamp = record.at.astimezone(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    path = d / layout.check_record_name(stamp, record.golden, record.golden_sha256)
    atomic.write_bytes(path, record.model_dump_json(indent=2).encode(), mode=0o444)
    return path


def load_baseline(store: LocalStore, name: str, golden: GoldenSet) -> Baseline | None:
    """The recorded baseline for this golden set, if any; one that is not a baseline of this model and golden set
    (garbage, a directory, another model's) is an IntegrityError: judging outputs against it would be wrong."""
    path = layout.baseline_path(store.root, name, golden.name)
    atomic.require_no_link(store.root, path, f"the baseline of {name}")
    try:
        baseline = Baseline.model_validate_json(entries.read_regular(path))
    except FileNotFoundError:
        return None
    except entries.NotRegular:
        raise atomic.not_ours(path, f"the baseline of golden set {golden.name!r}") from None
    except NotADirectoryError:
        raise atomic.not_ours(path.parent, f"the baselines directory of {name}") from None
    except ValueError as e:
        raise IntegrityError(f"baseline {path} does not parse: {str(e).splitlines()[0]}", hint=_REBASE) from None
    if (baseline.name, baseline.golden) != (name, golden.name):
        raise IntegrityError(f"{path} is the baseline of {baseline.name}'s golden set {baseline.golden!r}, not "
                             f"{name}'s {golden.name!r}", hint=_REBASE)
    return baseline


_REBASE = "record it again from a version you trust: `mreg check NAME@N --golden FILE --record-baseline`"


def save_baseline(store: LocalStore, baseline: Baseline) -> Path:
    """Replace a golden set's baseline (atomically)."""
    path = layout.baseline_path(store.root, baseline.name, baseline.golden)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_bytes(path, baseline.model_dump_json(indent=2).encode())
    return path


def check_problems(store: Store, version: Version, requirement: str) -> list[str]:
    """Why a `check[:GOLDEN]` requirement blocks promotion (empty when the latest matching check passed)."""
    golden = requirement.split(":", 1)[1] if ":" in requirement else None
    kept = store.check_records(version.name, version.number)
    if kept is None:
        return [f"{requirement}: check records are kept in local stores only in this build"]
    mine = [r for r in kept
            if r.manifest_sha256 == version.manifest_sha256 and (golden is None or r.golden == golden)]
    if not mine:
        what = f"golden set {golden!r}" if golden else "any golden set"
        return [f"no check of {what} has been run on {version.name}@{version.number} "
                f"(run `mreg check {version.name}@{version.number} --golden FILE`)"]
    latest = mine[-1]
    if latest.passed:
        return []
    failed = [f"{c.id} ({'; '.join(c.failures) or 'keywords'})" for c in latest.cases if not c.passed or c.failures]
    rate = "" if latest.keyword_hit_rate is None else (
        f"; keyword hit rate {latest.keyword_hit_rate:.2f} < {latest.min_keyword_hit_rate:.2f}"
        if latest.keyword_hit_rate < latest.min_keyword_hit_rate else "")
    return [f"the latest check of {latest.golden!r} failed: {', '.join(failed) or 'see the record'}{rate}"]
