"""Verification of a written GGUF file against its source, recorded in the manifest.

1. Re-opened with gguf's reader: every tensor present with the planned name, shape, type and
   offset, its first and last bytes those streamed there; every metadata key with its value.
2. Each tensor's encoding error (gguf's own dequantizer on sampled rows) under its type's bound.
3. When llama-cpp-python is installed: llama.cpp loads the file and tokenizes test strings to
   the same ids as the source's tokenizer as its tokenizer_config.json configures it
   (`converters.gguf.tokenization`), and its logits on a fixed prompt are compared with mreg's streaming float32
   forward pass of the safetensors source (`converters.gguf.reference`, tested equal to
   transformers; its memory stays flat whatever the model size), or on the first tokens of an evaluation text
   (`--evaluation`, see `converters.gguf.evaluation`): for F32, F16 and BF16 an integrity
   bound (max difference, KL divergence); for the quantized types KL divergence and top-1 agreement
   are quality, recorded against a budget (`budget`) and never failing the conversion.
Any integrity failure fails the conversion. `method` names only the checks that ran; those that could not are in
`not_run`, and a file llama.cpp never loaded (no runtime installed) is `structural`, never `passed`.
"""

from __future__ import annotations

import functools
import math
import os
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from converters.gguf import overlap
from converters.gguf.llama import SETTINGS, describe_exit, load
from converters.gguf.tokenization import reference

if TYPE_CHECKING:  # (the child processes import this module: the manifests' models stay out of their start)
    from gguf import GGUFReader

    from converters.gguf.plan import EncodedTensor, GGUFPlan
    from manifests import SourceInfo, Verification


#: Largest relative RMS error of a tensor's encoding (measured on Gaussian weights, with margin). The error is
#: unweighted: with an importance matrix the encoder trades error in unimportant columns for error in important
#: ones, so the IQ bounds are about twice what Gaussian rows measure under a skewed importance (Gamma(0.5)
#: weights: IQ4_XS 0.08, IQ3_S 0.16, IQ3_XXS 0.25, IQ2_S 0.29, IQ2_XS 0.38, IQ2_XXS 0.48, IQ1_M 0.54, IQ1_S 0.56).
#: They are integrity bounds: a wrong encoding (bytes of another type, a lost scale) measures 1 or more.
ERROR_BOUND = {"F32": 0.0, "F16": 1e-3, "BF16": 8e-3, "Q8_0": 0.02, "Q6_K": 0.05, "Q5_0": 0.08, "Q5_1": 0.08,
               "Q5_K": 0.08, "Q4_0": 0.16, "Q4_1": 0.16, "Q4_K": 0.16, "Q3_K": 0.3, "Q2_K": 0.6,
               "IQ4_NL": 0.16, "IQ4_XS": 0.16, "IQ3_S": 0.32, "IQ3_XXS": 0.5, "IQ2_S": 0.6, "IQ2_XS": 0.8,
               "IQ2_XXS": 0.95, "IQ1_M": 1.1, "IQ1_S": 1.1}
#: Integrity of the lossless and near-lossless types: llama.cpp running the file must compute what the source
#: computes. Largest max |logit difference| over all positions relative to the reference logits' std (a sanity
#: bound: llama.cpp keeps its KV cache in F16), and largest mean KL divergence (nats) of llama.cpp's next-token
#: distribution from the float32 reference's. A 7.6 B random-weight model at F16 measures KL 9e-6.
LOGITS_REL_DIFF = {"F32": 0.05, "F16": 0.1, "BF16": 0.2}
LOGITS_KL = {"F32": 1e-4, "F16": 1e-3, "BF16": 2e-3}
#: Quality of the quantized types: default budgets of the KL divergence, reported against and never failing the
#: conversion (a correct Q8_0 of a large random-weight model measures KL 0.0095, its Q4_K_M 0.49: that is the
#: type's noise, amplified by random weights, not a wrong file). Real models sit well inside them (llama.cpp's
#: own measurements: Q8_0 about 1e-3, Q4_K_M a few 1e-2). `promote --require gguf:quality` enforces them;
#: `--require gguf:kl=0.02` a budget of one's own. The file's integrity is its tensors' encoding error (below).
KL_BUDGET = {"Q8_0": 5e-3, "Q6_K": 0.02, "Q5_K_M": 0.04, "Q5_K_S": 0.04, "Q5_0": 0.05, "Q5_1": 0.05, "Q4_K_M": 0.1,
             "Q4_K_S": 0.1, "Q4_0": 0.15, "Q4_1": 0.15, "Q3_K_L": 0.25, "Q3_K_M": 0.3, "Q3_K_S": 0.4, "Q2_K": 1.0,
             "Q2_K_S": 1.2,
             # The IQ types, placed by bits per weight between the K-quants' budgets (mreg's choice: llama.cpp
             # publishes no per-type KL targets); the 1- and 2-bit ones assume an importance matrix.
             "IQ4_XS": 0.1, "IQ4_NL": 0.1, "IQ3_M": 0.3, "IQ3_S": 0.3, "IQ3_XS": 0.35, "IQ3_XXS": 0.4, "IQ2_M": 0.6,
             "IQ2_S": 0.8, "IQ2_XS": 0.9, "IQ2_XXS": 1.0, "IQ1_M": 1.5, "IQ1_S": 2.0}
TEST_STRINGS = (
    "Hello world! How are you today?",
    "The quick brown fox jumps over the lazy dog.",
    "  two leading spaces,\ttabs\tand\nnew lines\n\n",
    "1, 2, 3, 4, 5 and 10, 20, 30, 100, 12345.",
    "über café naïve — “quotes” and 日本語",
    "don't won't it's I'm we'll they've",
    "A model registry keeps track of every model.",
)
#: Why the checks of llama.cpp did not run, in a plain install (llama-cpp-python is the `gguf` extra).
NOT_INSTALLED = ("not loaded by llama.cpp: llama-cpp-python is not installed (pip install 'mreg[gguf]'), so its "
                 "tokenization and logits were not compared")
PROMPT = "The quick brown fox jumps over the lazy dog. A model registry keeps track of every model"


def _same(a: Any, b: Any) -> bool:
    if isinstance(b, float):
        return bool(np.float32(a) == np.float32(b))
    if isinstance(b, list) and b and isinstance(b[0], float):
        return bool(np.array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32)))
    return bool(a == b)


@functools.cache
def _reader_class() -> type[GGUFReader]:
    import gguf

    class Reader(gguf.GGUFReader):
        """gguf's reader with `data` a plain ndarray view of the map it opens."""

        @property  # type: ignore[override]
        def data(self) -> np.ndarray[Any, Any]:
            return self._plain

        @data.setter
        def data(self, mapped: np.ndarray[Any, Any]) -> None:
            self._plain = np.asarray(mapped)  # a base-class view: it holds the map open

    return Reader


def gguf_reader(path: Path) -> GGUFReader:
    """gguf's reader, parsing through a plain ndarray view of its map.

    Its parser slices the map once or more per vocabulary entry; on `np.memmap` every slice runs
    memmap's Python-level hooks, 60% of the parse of a 32 000-token vocabulary (1.04 s against 0.39).
    The view keeps the map alive and is read the same way.
    """
    return _reader_class()(path)


def check_file(path: Path, plan: GGUFPlan, encoded: Sequence[EncodedTensor]) -> list[str]:
    """Problems found re-reading the file with gguf's reader (empty when it is what was planned)."""
    problems: list[str] = []
    reader = gguf_reader(path)
    tensors = {t.name: t for t in reader.tensors}
    if len(reader.tensors) != len(encoded):
        problems.append(f"{len(reader.tensors)} tensors in the file, {len(encoded)} written")
    with open(path, "rb") as f:
        for e in encoded:
            t = tensors.get(e.info.name)
            if t is None:
                problems.append(f"tensor {e.info.name} missing")
                continue
            if tuple(int(d) for d in t.shape) != e.info.dims or t.tensor_type.name != e.info.qtype:
                problems.append(f"{e.info.name}: {t.tensor_type.name}{list(t.shape)} in the file, "
                                f"{e.info.qtype}{list(e.info.dims)} planned")
                continue
            if t.n_bytes != e.info.nbytes:
                problems.append(f"{e.info.name}: {t.n_bytes} bytes, {e.info.nbytes} planned")
                continue
            # The whole stream's sha256 was taken while writing; here the reader's offsets must land on
            # the bytes written for each tensor (plain reads: the reader's map would grow resident memory).
            f.seek(t.data_offset)
            head = f.read(len(e.head))
            f.seek(t.data_offset + t.n_bytes - len(e.tail))
            if head != e.head or f.read(len(e.tail)) != e.tail:
                problems.append(f"{e.info.name}: data in the file differs from what was written")
    for key, value in plan.metadata:
        field = reader.fields.get(key)
        if field is None:
            problems.append(f"metadata {key} missing")
        elif not _same(field.contents(), value):
            problems.append(f"metadata {key} differs")
    del reader
    return problems


def start_runtime(path: Path, file_type: str, directory: Path, cache: Path | None,
                  evaluation: tuple[Path, int] | None = None) -> subprocess.Popen[str] | str:
    """Start llama.cpp on the file in a child process (its memory and any crash stay there), or say why not.

    The child runs while the parent re-reads the file with gguf's reader: two cores, two checks.
    """
    import importlib.util
    import sys

    if importlib.util.find_spec("llama_cpp") is None:
        return NOT_INSTALLED
    cmd = [sys.executable, "-m", "converters.gguf.verify", str(path), str(directory), file_type,
           str(cache) if cache is not None else ""]
    if evaluation is not None:
        cmd += [str(evaluation[0]), str(evaluation[1])]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=overlap.child_env())


@dataclass(frozen=True)
class RuntimeResult:
    """What the llama.cpp child found: problems, metrics, notes, the checks that ran and those that did not."""

    problems: list[str]
    metrics: dict[str, float]
    notes: list[str]
    ran: list[str]
    not_run: list[str]


def finish_runtime(child: subprocess.Popen[str] | str) -> RuntimeResult:
    """The child's result (`child` a string: why llama.cpp did not run, so none of its checks did)."""
    import json

    if isinstance(child, str):
        return RuntimeResult([], {}, [], [], [child])
    stdout, stderr = child.communicate()
    if child.returncode != 0:
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        return RuntimeResult([f"llama.cpp could not load or run the file ({describe_exit(child.returncode)}): "
                              f"{tail}"], {}, [], [], [])
    doc = json.loads(stdout.strip().splitlines()[-1])
    return RuntimeResult(doc["problems"], doc["metrics"], doc["notes"], doc["ran"], doc["not_run"])


def run_runtime(path: Path, directory: Path, file_type: str, cache: str, evaluation: str = "",
                cap: int = 0) -> dict[str, Any]:
    """The child process's work: load with llama.cpp, compare tokenization and logits with the reference.

    The reference runs after llama.cpp has let go of the file. With `cache` (an .npz path), several
    files of one source compute it once: the first saves ids and logits there, the others read them; a
    pass started beside the write (`converters.gguf.overlap`) is waited for and its saved logits used.
    With `evaluation` (a text file), its first `cap` tokens are evaluated instead of the fixed prompt.
    Kept in one piece (70 lines): it is the whole life of a child process, its steps sharing one loaded model.
    """
    import time

    from converters.gguf.reference import ReferenceUnsupported, reference_logits

    problems: list[str] = []
    metrics: dict[str, float] = {}
    notes: list[str] = []
    ran = ["load"]
    not_run: list[str] = []
    tokenizer = reference(directory)
    hf = tokenizer.encode
    n_ctx = max(256, cap) if evaluation else 256
    llm = load(path, n_ctx=n_ctx, n_batch=n_ctx, logits_all=True, n_threads=max(1, os.cpu_count() or 1), seed=0)
    metrics["llama_cpp_loaded"] = 1.0
    if hf is None:
        not_run.append(f"tokenization not compared with the source's tokenizer: {tokenizer.label}")
    else:
        # add_bos: llama.cpp adds the special tokens its file says to (tokenizer.ggml.add_bos_token/add_eos_token).
        mismatched = [s for s in TEST_STRINGS if llm.tokenize(s.encode(), add_bos=True, special=False) != hf(s)]
        metrics["tokenization_strings"] = float(len(TEST_STRINGS))
        metrics["tokenization_mismatches"] = float(len(mismatched))
        ran.append(f"tokenization against the source's tokenizer ({tokenizer.label})")
        problems += [f"llama.cpp tokenizes {s!r} differently from the source's tokenizer as configured "
                     f"({tokenizer.label}): {llm.tokenize(s.encode(), add_bos=True, special=False)[:8]} against "
                     f"{hf(s)[:8]}" for s in mismatched]
    text = Path(evaluation).read_text(encoding="utf-8") if evaluation else PROMPT
    ids = hf(text) if hf is not None else llm.tokenize(text.encode(), add_bos=True, special=False)
    if evaluation:
        ids = list(ids)[:cap]
        metrics["evaluation_tokens"] = float(len(ids))
    llm.eval(ids)
    got = np.array(llm.scores[: len(ids)], dtype=np.float32)
    llm.close()
    if cache:
        overlap.wait_for(Path(cache))  # a reference pass started beside the write (converters.gguf.overlap)
    # One saved pass per token sequence: files of one source measured on other texts (F16 on the fixed prompt,
    # Q4_K_M on the evaluation text) each find their own.
    saved_at = reference_cache(Path(cache), ids) if cache else None
    saved = np.load(saved_at) if saved_at is not None and saved_at.is_file() else None
    if saved is not None and saved["ids"].tolist() == list(ids):
        ref = saved["logits"]
    else:
        t0 = time.monotonic()
        try:
            ref = reference_logits(directory, ids)
        except ReferenceUnsupported as e:
            not_run.append(f"logits not compared: {e}")
            return {"problems": problems, "metrics": metrics, "notes": notes, "ran": ran, "not_run": not_run}
        metrics["reference_seconds"] = round(time.monotonic() - t0, 3)
        if saved_at is not None:
            save_reference(saved_at, ids, ref)
    ref = ref[:, : got.shape[1]]
    compared, found = compare_logits(got, ref, file_type, ids)
    metrics.update(compared)
    metrics["logits_positions"] = float(len(ids))
    ran.append("logits against mreg's streaming float32 forward pass of the safetensors source (tested equal to "
               "transformers)")
    return {"problems": problems + found, "metrics": metrics, "notes": notes, "ran": ran, "not_run": not_run}


def reference_cache(cache: Path, ids: Sequence[int]) -> Path:
    """Where the reference logits of one token sequence are saved beside `cache` (named by the ids' digest)."""
    import hashlib

    digest = hashlib.sha256(np.asarray(ids, np.int64).tobytes()).hexdigest()[:16]
    return cache.with_name(f"{cache.stem}-{digest}{cache.suffix}")


def save_reference(path: Path, ids: Sequence[int], logits: np.ndarray[Any, Any]) -> None:
    """The ids and their reference logits, written under a temporary name and renamed (never read half-written)."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, ids=np.asarray(ids, np.int64), logits=logits)
    os.replace(tmp, path)


#: Positions compared at a time: float64 work arrays of rows × vocabulary stay small (64 × 152 K = 78 MB).
COMPARE_ROWS = 64


def run_reference(directory: Path, cache: Path, evaluation: str = "", cap: int = 0) -> dict[str, float]:
    """The reference child's work (`converters.gguf.overlap`): the ids the verification will evaluate, their
    reference logits, saved beside `cache` for those ids (`reference_cache`); its seconds (nothing: no cache)."""
    import time

    from converters.gguf.reference import ReferenceUnsupported, reference_logits

    hf = reference(directory).encode
    if hf is None:  # llama.cpp's own tokenization gives the ids then: the verification computes the reference
        return {}
    text = Path(evaluation).read_text(encoding="utf-8") if evaluation else PROMPT
    ids = list(hf(text))
    if evaluation:
        ids = ids[:cap]
    t0 = time.monotonic()
    try:
        logits = reference_logits(directory, ids)
    except ReferenceUnsupported:
        return {}  # the verification meets the same refusal and records it
    seconds = time.monotonic() - t0
    save_reference(reference_cache(cache, ids), ids, logits)
    return {"seconds": round(seconds, 3)}


def compare_logits(got: np.ndarray[Any, Any], ref: np.ndarray[Any, Any], file_type: str,
                   ids: Sequence[int] | None = None) -> tuple[dict[str, float], list[str]]:
    """llama.cpp's logits against the reference's: the metrics and the problems (NaN or Inf on either side is one).

    Metrics: max difference, top-1 agreement, mean and 99th-percentile KL divergence over positions; with the
    evaluated `ids`, the perplexity of each side on them (each position predicting the next id) and their ratio.
    Computed `COMPARE_ROWS` positions at a time in float64, so memory stays near the two logit arrays themselves
    (512 positions of a 152 K vocabulary are 311 MB each in float32) whatever the number of positions.
    """
    from converters.gguf.reference import softmax

    metrics = {"logits_nonfinite": float(got.size - np.isfinite(got).sum()),
               "reference_logits_nonfinite": float(ref.size - np.isfinite(ref).sum())}
    problems = [f"{who} logits have {_values(int(metrics[key]))}" for who, key in
                (("llama.cpp's", "logits_nonfinite"), ("the float32 reference's", "reference_logits_nonfinite"))
                if metrics[key]]
    n = len(ref)
    nxt = np.asarray(ids[1:], dtype=np.int64) if ids is not None and len(ids) > 1 else None
    kl = np.empty(n, np.float64)
    agree = 0
    max_diff = total = total2 = nll_ref = nll_got = 0.0
    with np.errstate(all="ignore"):  # NaN and Inf give NaN metrics, which the bounds below fail
        for start in range(0, n, COMPARE_ROWS):
            r = ref[start:start + COMPARE_ROWS].astype(np.float64)
            g = got[start:start + COMPARE_ROWS].astype(np.float64)
            total, total2 = total + float(r.sum()), total2 + float(np.square(r).sum())
            diff = float(np.abs(g - r).max(initial=0.0))
            max_diff = diff if math.isnan(diff) else max(max_diff, diff)
            agree += int((g.argmax(-1) == r.argmax(-1)).sum())
            p, q = softmax(r), softmax(g)
            kl[start:start + len(r)] = np.sum(p * (np.log(p + 1e-30) - np.log(q + 1e-30)), axis=-1)
            if nxt is not None:
                rows = np.arange(len(r))[: max(0, len(nxt) - start)]
                at = nxt[start:start + len(rows)]
                nll_ref -= float(np.log(p[rows, at] + 1e-30).sum())
                nll_got -= float(np.log(q[rows, at] + 1e-30).sum())
        count = max(1, ref.size)
        scale = math.sqrt(max(0.0, total2 / count - (total / count) ** 2)) if math.isfinite(total2) else math.nan
        metrics["logits_max_abs_diff"] = max_diff
        metrics["logits_max_rel_diff"] = max_diff / (scale or 1.0)
        metrics["top1_agreement"] = agree / max(1, n)
        metrics["kl_divergence"] = float(np.mean(kl))
        metrics["kl_divergence_p99"] = float(np.percentile(kl, 99))
        if nxt is not None:
            metrics["perplexity_reference"] = math.exp(nll_ref / len(nxt))
            metrics["perplexity_llama_cpp"] = math.exp(nll_got / len(nxt))
            metrics["perplexity_ratio"] = metrics["perplexity_llama_cpp"] / metrics["perplexity_reference"]
    if file_type in LOGITS_REL_DIFF and not metrics["logits_max_rel_diff"] <= LOGITS_REL_DIFF[file_type]:
        problems.append(f"logits differ from the float32 reference by {metrics['logits_max_rel_diff']:.3g} std "
                        f"(bound {LOGITS_REL_DIFF[file_type]})")
    if file_type in LOGITS_KL and not metrics["kl_divergence"] <= LOGITS_KL[file_type]:
        problems.append(f"KL divergence from the float32 reference {metrics['kl_divergence']:.3g} "
                        f"(bound {LOGITS_KL[file_type]})")
    if not math.isfinite(metrics["kl_divergence"]) and not problems:  # NaN/Inf of either side is named above
        problems.append("the KL divergence from the float32 reference is not finite")
    return metrics, problems


def quality_notes(metrics: dict[str, float], file_type: str) -> list[str]:
    """What a quantized file's quality measures against its default budget (notes, not failures)."""
    budget = KL_BUDGET.get(file_type)
    kl = metrics.get("kl_divergence")
    if budget is None or kl is None or not kl > budget:
        return []
    return [f"quality: KL divergence {kl:.3g} is over the {file_type} budget {budget} (top-1 agreement "
            f"{metrics.get('top1_agreement', float('nan')):.2f}); expected of random weights, not of a trained "
            "model: `promote --require gguf:quality` refuses it"]


def _values(n: int) -> str:
    return f"{n} NaN/Inf value{'s' * (n != 1)}"


def nonfinite_problems(plan: GGUFPlan, encoded: Sequence[EncodedTensor], limit: int = 10) -> list[str]:
    """One line per tensor with NaN or Inf values in the source or in what was written (the first `limit`)."""
    lines = []
    for t, e in zip(plan.model.tensors, encoded, strict=True):
        name = f"{t.source_name} ({e.info.name})" if t.source_name else e.info.name
        if e.source_nonfinite:
            lines.append(f"source tensor {name} has {_values(e.source_nonfinite)}")
        if e.encoded_nonfinite:
            lines.append(f"tensor {name} written as {e.info.qtype} has {_values(e.encoded_nonfinite)}")
    return lines[:limit] + ([f"and {len(lines) - limit} more"] if len(lines) > limit else [])


def evaluation_text(plan: GGUFPlan, evaluation: dict[str, Any] | None) -> tuple[Path, int] | None:
    """The evaluation text's path and how many of its tokens are evaluated (None: the fixed prompt)."""
    from converters.gguf import evaluation as texts

    if evaluation is None:
        return None
    context = next((int(v) for k, v in plan.model.metadata if k.endswith(".context_length")), None)
    return texts.path_of(evaluation), min(int(evaluation["max_tokens"]), context or texts.MAX_TOKENS)


def verify(path: Path, plan: GGUFPlan, encoded: Sequence[EncodedTensor], directory: Path,
           source: SourceInfo, reference_cache: Path | None = None,
           evaluation: dict[str, Any] | None = None) -> Verification:
    """Run every check that can run here and return the verification record (`evaluation`: the normalized
    `--evaluation` option; None: the fixed prompt)."""
    from converters.gguf import evaluation as texts
    from manifests import Verification

    child = start_runtime(path, plan.file_type, directory, reference_cache, evaluation_text(plan, evaluation))
    try:
        problems = check_file(path, plan, encoded)
    except BaseException:
        if not isinstance(child, str):
            child.kill()
            child.wait()
        raise
    problems += nonfinite_problems(plan, encoded)
    worst: dict[str, float] = {}
    for e in encoded:
        bound = ERROR_BOUND[e.info.qtype]
        # NaN is the worst error: max() would drop it.
        worst[e.info.qtype] = max(worst.get(e.info.qtype, 0.0), e.rel_rmse,
                                  key=lambda v: math.inf if math.isnan(v) else v)
        if not e.rel_rmse <= bound and e.info.qtype != "F32":  # NaN fails too
            problems.append(f"{e.info.name}: relative RMS error {e.rel_rmse:.3g} over the {e.info.qtype} bound {bound}")
    metrics: dict[str, float] = {"tensors": float(len(encoded)), "metadata_keys": float(len(plan.metadata)),
                                 "source_nonfinite": float(sum(e.source_nonfinite for e in encoded)),
                                 "encoded_nonfinite": float(sum(e.encoded_nonfinite for e in encoded))}
    metrics.update({f"rel_rmse_{k}": round(v, 6) for k, v in sorted(worst.items())})
    tolerance = {f"rel_rmse_{k}": ERROR_BOUND[k] for k in sorted(worst)}
    tolerance |= {"source_nonfinite": 0.0, "encoded_nonfinite": 0.0}
    runtime = finish_runtime(child)
    problems += runtime.problems
    metrics.update(runtime.metrics)
    if "kl_divergence" in metrics:  # the tolerances of the checks that ran, and only those
        if plan.file_type in LOGITS_REL_DIFF:
            tolerance["logits_max_rel_diff"] = LOGITS_REL_DIFF[plan.file_type]
        if plan.file_type in LOGITS_KL:
            tolerance["kl_divergence"] = LOGITS_KL[plan.file_type]
    budget = {"kl_divergence": KL_BUDGET[plan.file_type]} if plan.file_type in KL_BUDGET else {}
    notes = runtime.notes + quality_notes(metrics, plan.file_type)
    if "tokenization_mismatches" in metrics:
        tolerance["tokenization_mismatches"] = 0.0
    if "logits_nonfinite" in metrics:
        tolerance |= {"logits_nonfinite": 0.0, "reference_logits_nonfinite": 0.0}
    method = "gguf reader: tensors, shapes, types, data digests and metadata; encoding error per tensor"
    if runtime.ran:
        method += (f"; llama.cpp ({', '.join(f'{k}={v}' for k, v in SETTINGS.items())}: weights read from the mapped "
                   f"file, not repacked): {', '.join(runtime.ran)}")
    detail = "; ".join(problems[:20] + notes) or None
    loaded = "llama_cpp_loaded" in metrics
    return Verification(
        # structural: the file is what was planned, but llama.cpp never loaded it (a plain install has no runtime).
        status="failed" if problems else "passed" if loaded else "structural",
        not_run=tuple(runtime.not_run),
        method=method,
        reference=f"{source.repo}@{source.commit}",
        inputs=(*TEST_STRINGS, PROMPT if evaluation is None else texts.describe(
            evaluation, int(metrics["evaluation_tokens"]) if "evaluation_tokens" in metrics else None)),
        metrics=metrics,
        tolerance=tolerance,
        budget=budget,
        detail=detail,
    )


if __name__ == "__main__":
    import json
    import sys

    if sys.argv[1] == "--reference":
        given = (sys.argv[4], int(sys.argv[5])) if len(sys.argv) > 5 else ("", 0)
        print(json.dumps(run_reference(Path(sys.argv[2]), Path(sys.argv[3]), *given)))
    else:
        extra = (sys.argv[5], int(sys.argv[6])) if len(sys.argv) > 6 else ("", 0)
        print(json.dumps(run_runtime(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], *extra)))
