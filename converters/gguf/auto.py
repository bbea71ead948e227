"""`--to gguf:auto`: the smallest file type whose measured quality meets a budget.

Every candidate is planned first (config and headers only), which gives each one's tensor bytes
before anything is written. In that size order quality is close to monotone (more bits, less
error), so the search is a bisection: the middle candidate is converted and verified on the
evaluation text; if it meets the budget the answer is it or a smaller one, else a larger one.
Thirteen candidates (22 with an importance matrix, which admits the 1- and 2-bit IQ types) take
four (five) conversions instead of up to thirteen (22) from the smallest up, which would also start
with the likeliest failures. With `--calibration` or `--imatrix` the matrix is made or read once and
every candidate is quantized with it, as llama-quantize does. The reference forward pass runs
once and is shared (`.mreg-reference-*.npz`). A candidate that loses is deleted as soon as it is
judged, its figures kept: the version holds the chosen file, the chart (`auto.svg`) and, in the
manifest, every candidate's size and, for those tried, quality. If quality is not monotone on a
model, bisection can miss a smaller type that would pass: the chart shows what was tried.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from converters.gguf.plan import EncodedTensor
from converters.gguf.quality import KEYS, misses
from converters.gguf.stream import write
from converters.gguf.work import Work, result
from manifests import GGUFCandidate, GGUFRequirements, GGUFSelection, Verification
from registry.convert.protocol import ConversionRequest, ConversionResult
from registry.errors import GateRefused, UsageError

#: The types `gguf:auto` chooses from, nominally largest first (the search sorts them by planned bytes): the
#: K-quant mixes and the IQ types llama.cpp writes without an importance matrix. IQ4_NL is left out: it is
#: IQ4_XS's size class with larger blocks, kept in llama.cpp for CPUs that repack it, never the smaller choice.
CANDIDATES: tuple[str, ...] = ("Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_M", "Q4_K_S", "IQ4_XS", "Q3_K_L", "Q3_K_M",
                               "IQ3_M", "IQ3_S", "Q3_K_S", "Q2_K")
#: With an importance matrix (`--calibration` or `--imatrix`), the types llama.cpp writes only with one join them.
WEIGHTED_CANDIDATES: tuple[str, ...] = (*CANDIDATES, "IQ3_XS", "IQ3_XXS", "Q2_K_S", "IQ2_M", "IQ2_S", "IQ2_XS",
                                        "IQ2_XXS", "IQ1_M", "IQ1_S")
#: The budget when none is given: a mean KL divergence llama.cpp's Q4_K_M of a trained model meets.
DEFAULT_BUDGET = {"kl_divergence": 0.02}
SEARCH = "bisection"
#: The chart of the trade-off, in the artifact's directory.
CHART = "auto.svg"
#: Metrics kept per candidate (the chart's and the budget's).
KEPT = ("kl_divergence", "kl_divergence_p99", "top1_agreement", "perplexity_ratio", "perplexity_reference",
        "perplexity_llama_cpp", "evaluation_tokens", "logits_positions")


def candidates(weighted: bool) -> tuple[str, ...]:
    """The candidate types: with an importance matrix (`weighted`) the 1-, 2- and smallest 3-bit types too."""
    return WEIGHTED_CANDIDATES if weighted else CANDIDATES


def size_order(sizes: Sequence[int]) -> list[int]:
    """Candidate indices from the smallest planned file to the largest; ties go to the later (nominally smaller)."""
    return sorted(range(len(sizes)), key=lambda i: (sizes[i], -i))


def bisect(count: int, meets: Callable[[int], bool]) -> tuple[int | None, list[int]]:
    """The smallest position in [0, count) that meets, if meeting is monotone, and the positions tried in order."""
    lo, hi, best, tried = 0, count - 1, None, []
    while lo <= hi:
        mid = (lo + hi) // 2
        tried.append(mid)
        if meets(mid):
            best, hi = mid, mid - 1
        else:
            lo = mid + 1
    return best, tried


def candidate(qtype: str, tensor_bytes: int, file_bytes: int | None, metrics: dict[str, float] | None,
              budget: dict[str, float]) -> GGUFCandidate:
    """One candidate's record: figures kept, judged against the budget when it was tried."""
    if metrics is None:
        return GGUFCandidate(type=qtype, tensor_bytes=tensor_bytes)
    kept = {k: metrics[k] for k in KEPT if k in metrics}
    return GGUFCandidate(type=qtype, tensor_bytes=tensor_bytes, file_bytes=file_bytes, tried=True,
                         meets=not misses(metrics, budget), metrics=kept)


def check_measured(qtype: str, metrics: dict[str, float], budget: dict[str, float], detail: str | None) -> None:
    """A candidate whose budgeted figures could not be measured (no reference for the model) stops the search."""
    absent = [m for m in budget if m not in metrics]
    if absent:
        raise UsageError(f"gguf:auto could not measure {', '.join(absent)} of {qtype}: {detail or 'no figures'}",
                         hint="convert a named type instead (--to gguf:Q4_K_M)")


def none_meets(candidates: Sequence[GGUFCandidate], budget: dict[str, float]) -> GateRefused:
    """The refusal when no candidate meets the budget: the best one's figures in the message (exit 6)."""
    tried = [c for c in candidates if c.tried]
    first = next(iter(budget))
    upper = dict(KEYS.values()).get(first, True)
    best = sorted(tried, key=lambda c: c.metrics.get(first, float("inf")) * (1 if upper else -1))[0]
    figures = ", ".join(f"{k} {best.metrics[k]:.4g}" for k in budget if k in best.metrics)
    wanted = ", ".join(f"{k} {'>=' if not dict(KEYS.values()).get(k, True) else '<='} {v:g}" for k, v in budget.items())
    return GateRefused(
        f"gguf:auto: no candidate meets {wanted}; the best tried, {best.type} ({best.tensor_bytes} bytes of "
        f"tensors), measures {figures} ({len(tried)} of {len(candidates)} tried)",
        hint="loosen the budget (--budget kl=…), or convert a named type (--to gguf:Q8_0); nothing was published",
        details={"budget": budget, "candidates": [c.model_dump(mode="json") for c in candidates]})


def search(request: ConversionRequest, work: Work) -> ConversionResult:
    """Bisect the prepared candidates in size order (each tried one written and verified), keep the chosen."""
    from converters.gguf import chart, overlap
    from converters.gguf import verify as gguf_verify
    from converters.gguf.model import SafetensorsReader

    opts = request.options
    budget: dict[str, float] = dict(opts["budget"])
    types = list(opts["candidates"])
    planned, made = work.planned, work.made
    sizes = [sum(i.nbytes for i in p.infos) for p in planned]
    order = [i for i in size_order(sizes) if i in work.eligible]
    measured: dict[int, tuple[dict[str, float], int]] = {}
    kept: list[tuple[int, Path, str, list[EncodedTensor], Verification]] = []
    seconds = {"write_seconds": 0.0, "verify_seconds": 0.0}

    def meets(pos: int) -> bool:
        i = order[pos]
        p = planned[i]
        dest = request.workdir / f"{work.base}-{p.file_type}.gguf"
        reader = SafetensorsReader()
        request.progress.start(f"gguf:auto {dest.name} ({len(measured) + 1} tried)", sizes[i])
        t0 = time.monotonic()
        try:
            ((digest, encoded),) = write([p], [dest], reader, max(1, os.cpu_count() or 1), request.progress,
                                         [made.importance] if made else ())
        finally:
            reader.close()
            request.progress.done()
        t1 = time.monotonic()
        v = gguf_verify.verify(dest, p, encoded, work.directory, request.source, work.reference, opts["evaluation"])
        seconds["write_seconds"] += t1 - t0
        seconds["verify_seconds"] += time.monotonic() - t1
        if v.status == "failed":  # an integrity failure: the registry refuses the conversion with it
            raise _CandidateFailed(result(p, dest, digest, encoded, v, made.record if made else None))
        check_measured(p.file_type, v.metrics, budget, v.detail)
        measured[i] = (v.metrics, dest.stat().st_size)
        if misses(v.metrics, budget):
            dest.unlink()
            return False
        for _, older, *_ in kept:  # a larger file that met the budget: this one is smaller
            older.unlink()
        kept[:] = [(i, dest, digest, encoded, v)]
        return True

    ahead = work.start_reference(gguf_verify.evaluation_text(planned[0], opts["evaluation"]))
    try:
        found, tried = bisect(len(order), meets)
    except _CandidateFailed as failed:
        return failed.result
    finally:
        if ahead is not None:
            overlap.stop(ahead)
    records = [candidate(t, sizes[i], measured[i][1] if i in measured else None,
                         measured[i][0] if i in measured else None, budget) for i, t in enumerate(types)]
    if found is None:
        raise none_meets(records, budget)
    i, dest, digest, encoded, v = kept[0]
    (request.workdir / CHART).write_text(
        chart.render(records, budget, types[i], f"{work.base}: gguf:auto chose {types[i]}"), encoding="utf-8")
    metrics = {**v.metrics, **{k: round(x, 3) for k, x in seconds.items()},
               "auto_candidates": float(len(types)), "auto_tried": float(len(tried))}
    chosen = result(planned[i], dest, digest, encoded, v.model_copy(update={"metrics": metrics, "budget": budget}),
                    made.record if made else None)
    if made:
        chosen.known_digests[made.record.file] = made.record.sha256
    selection = GGUFSelection(budget=budget, chosen=types[i], search=SEARCH, tried=len(tried),
                              candidates=tuple(records), chart=CHART)
    assert isinstance(chosen.requirements, GGUFRequirements)
    return dataclasses.replace(chosen, requirements=chosen.requirements.model_copy(update={"selection": selection}))


class _CandidateFailed(Exception):
    """A candidate failed its integrity checks: the search stops with its result."""

    def __init__(self, failed: ConversionResult) -> None:
        super().__init__(failed.verification.detail)
        self.result = failed
