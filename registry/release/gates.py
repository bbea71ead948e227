"""Promotion gates: every reason a version may not take an alias, each answered by whoever owns it.

A failed verification always blocks. A requirement (`--require`, or `require` under
`[models.NAME]`) names a format, which the format's converter judges (`tensorrt:sm_80,sm_90`
asks for engines; `gguf:quality` or `gguf:kl=0.02` every GGUF file's measured quality within a budget),
`check[:GOLDEN]`, a passing golden-set check, `signature`: at least one signature that verifies against the
model's trust policy (on a local store, against the bytes too), or `loaded`: every artifact loaded and run by its
runtime (a `structural` GGUF, never loaded by llama.cpp, or an `unverified` TensorRT engine, is refused).
"""

from __future__ import annotations

from collections.abc import Sequence

from manifests import Artifact
from registry.convert.formats import get, known
from registry.release.check import check_problems
from registry.store.protocol import Store, Version
from registry.store.signatures import judge, signature_problems
from registry.store.trust import TrustPolicy


def check_gates(version: Version, requirements: Sequence[str] = (), store: Store | None = None,
                trust: TrustPolicy | None = None) -> list[str]:
    """Every reason a version may not be promoted (empty when it may).

    A requirement is a format (`hf`, `gguf`, …) the version must carry, or `check[:GOLDEN]`: the
    latest golden-set check of this version (of that set) must have passed, or `tensorrt:sm_80,sm_90`:
    an engine for each of these compute capabilities, or `loaded`: every artifact run by its runtime.
    """
    problems = []
    for art in version.manifest.artifacts:
        if art.verification.status == "failed":
            problems.append(f"{art.format} artifact failed verification ({art.verification.method})")
    formats = {a.format for a in version.manifest.artifacts}
    for req in requirements:
        kind = req.split(":", 1)[0]
        if req == "signature":
            problems += _signature_gate(version, store, trust or TrustPolicy())
        elif req == "loaded":
            problems += [_never_loaded(a) for a in version.manifest.artifacts if not a.verification.loaded()]
        elif kind == "check":
            problems += check_problems(store, version, req) if store is not None else [
                f"{req}: no store to read check records from"]
        elif known(kind):
            # Every artifact of the format answers (a version can hold several GGUF types, each judged).
            arts: list[Artifact | None] = [a for a in version.manifest.artifacts if a.format == kind] or [None]
            for candidate in arts:
                problems += get(kind).gate_problems(candidate, req)
        elif kind not in formats:
            problems.append(f"no {kind} artifact (required by --require {req})")
    return problems


def _never_loaded(art: Artifact) -> str:
    v = art.verification
    why = "; ".join((v.status, *v.unrun()))
    return f"{art.format} artifact was never loaded and run by its runtime (verification {why})"


def _signature_gate(version: Version, store: Store | None, trust: TrustPolicy) -> list[str]:
    if store is None:
        return ["signature: no store to read signatures from"]
    if trust.empty:
        return signature_problems([], version, trust)
    files = store.files_dir(version)
    return signature_problems([judge(r, version, trust, files) for r in store.signatures(version.name, version.number)],
                              version, trust)
