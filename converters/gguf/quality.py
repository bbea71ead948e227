"""The gates of GGUF files: `--require gguf:loaded` (llama.cpp loaded the file), `--require gguf:quality` and
`--require gguf:kl=0.02,kl99=0.2,top1=0.9,ppl=1.02`
(mean and 99th-percentile KL divergence, top-1 agreement, perplexity ratio to the reference).

A quantized file's KL divergence and top-1 agreement against the float32 reference are recorded by its
verification and judged here, at promotion, against a budget: the defaults its verification recorded
(`budget`, see converters/gguf/verify.KL_BUDGET) or the requirement's own. The conversion itself fails on
integrity only, so a correct file of a random-weight model is published, and whether its quality is good enough
to serve is a release decision.
"""

from __future__ import annotations

import math

from manifests import Artifact
from registry.errors import UsageError

#: Requirement keys -> (metric, is the budget an upper bound).
KEYS = {"kl": ("kl_divergence", True), "kl99": ("kl_divergence_p99", True), "top1": ("top1_agreement", False),
        "ppl": ("perplexity_ratio", True)}
_UPPER = dict(KEYS.values())


def parse(requirement: str) -> dict[str, float] | None:
    """`gguf` -> None (presence only); `gguf:quality` -> {} (the recorded budgets); `gguf:kl=X,top1=Y` -> those."""
    if ":" not in requirement:
        return None
    spec = requirement.split(":", 1)[1]
    if spec == "quality":
        return {}
    out: dict[str, float] = {}
    for part in spec.split(","):
        key, _, value = part.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if key not in KEYS or not math.isfinite(number) or number < 0:
            raise UsageError(f"--require {requirement}: cannot read {part!r}",
                             hint="use gguf:quality, or gguf:kl=0.02, kl99=0.2, top1=0.9, ppl=1.02 (comma-separated)")
        out[KEYS[key][0]] = number
    return out


def misses(metrics: dict[str, float], budget: dict[str, float]) -> list[str]:
    """The budget's metrics that the figures miss (absent or NaN ones too)."""
    out = []
    for metric, bound in budget.items():
        value = metrics.get(metric)
        if value is None or not (value <= bound if _UPPER.get(metric, True) else value >= bound):
            out.append(metric)
    return out


def gate_problems(artifact: Artifact | None, requirement: str) -> list[str]:
    """Why a GGUF artifact fails the requirement (empty when it meets it); `gguf:loaded`: llama.cpp loaded it."""
    wanted = None if requirement == "gguf:loaded" else parse(requirement)
    if artifact is None:
        return [f"no gguf artifact (required by --require {requirement})"]
    if requirement == "gguf:loaded" and not artifact.verification.loaded():
        why = "; ".join((artifact.verification.status, *artifact.verification.unrun()))
        return [f"{artifact.path}: never loaded by llama.cpp (verification {why})"]
    if wanted is None:
        return []
    v = artifact.verification
    budget = wanted or dict(v.budget)
    name = next((f.path for f in artifact.files if f.path.endswith(".gguf")), artifact.path)
    problems = []
    for metric, bound in budget.items():
        upper = _UPPER.get(metric, True)  # a metric of a newer mreg's budget: a largest value, as most are
        value = v.metrics.get(metric)
        if value is None:
            problems.append(f"{name}: no {metric} was measured (verification: {v.status}), so {requirement} "
                            "cannot be judged; convert where llama-cpp-python is installed")
        elif not (value <= bound if upper else value >= bound):  # NaN fails
            problems.append(f"{name}: {metric} {value:.3g} misses the budget {bound} (--require {requirement})")
    return problems
