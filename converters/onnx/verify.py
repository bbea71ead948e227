"""Verification of an ONNX export: ONNX Runtime against PyTorch on real tokens, and greedy generation.

The probes are tokenized once. PyTorch's outputs come from the loaded transformers model itself (not
the export wrapper); the written files are loaded by ONNX Runtime (its CPU provider, and its CUDA
provider too where onnxruntime-gpu has a device) and run on the same token batches:
one unpadded sequence, a left-padded batch of two and a right-padded batch of three of different
lengths. Every output is compared on the real (unmasked) tokens; a NaN
or Inf anywhere in any output fails. With past key/values, 16 greedy tokens from left-padded prompts,
fed back through the KV cache, must equal `model.generate`'s.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from converters.hf.tokenizer import plain_greedy
from converters.onnx import upcast
from converters.onnx.export import Signature, cache_kwarg, cache_of
from converters.onnx.graph import MODEL_FILE
from manifests import SourceInfo, Verification

Array = npt.NDArray[Any]

TEXTS = (
    "Hello world! How are you today?",
    "A model registry keeps track of every model that a team trains, downloads or ships to production.",
    "The quick brown fox jumps over the lazy dog.",
    "When you pull a model, the registry checks the digest of each file, so a broken download is caught "
    "before it reaches a server; readers never see a half written directory.",
    "1, 2, 3, 4, 5 and 10, 20, 30, 100.",
    "This is a test.",
)
#: (texts, padding side) of each compared batch.
BATCHES = ((TEXTS[2:3], "right"), (TEXTS[0:2], "left"), (TEXTS[3:6], "right"))
GENERATE_TOKENS = 16
#: ONNX Runtime's GPU provider: where onnxruntime-gpu has a device, the probes run there too.
GPU_PROVIDER = "CUDAExecutionProvider"
#: Prefix of the metrics measured on GPU_PROVIDER (those on the CPU provider have none).
GPU_PREFIX = "cuda."
MAX_TOKENS = 48


@dataclass(frozen=True)
class Thresholds:
    """What an output must meet: max |difference| <= max_abs + rel * max |reference| of that output (fp32),
    or min cosine and top-1 agreement."""

    max_abs: float | None = None
    #: The part of the fp32 bound that grows with the output: real logits reach tens, and fp32 summation in
    #: another order differs by a few units in the last place of each value.
    rel: float = 0.0
    min_cosine: float | None = None
    mean_cosine: float | None = None
    min_top1: float | None = None
    exact_generation: bool = False


#: Per precision, as the README states. fp32 differs from PyTorch only by summation order; fp16 and
#: int8 change the numbers on purpose, so they are judged by direction (cosine) and argmax (top-1).
THRESHOLDS = {
    "fp32": Thresholds(max_abs=1e-4, rel=1e-5, exact_generation=True),
    "fp16": Thresholds(min_cosine=0.999, min_top1=0.95),
    "int8": Thresholds(min_cosine=0.95, mean_cosine=0.98, min_top1=0.80),
}


@dataclass(frozen=True)
class Case:
    """One compared batch: its description and token inputs."""

    label: str
    feeds: dict[str, Array]


@dataclass(frozen=True)
class Probes:
    """The inputs both sides run, from the model's tokenizer: the batches and, with past, the prompts."""

    cases: tuple[Case, ...]
    prompts: dict[str, Array] = field(default_factory=dict)
    eos: tuple[int, ...] = ()
    pad: int = 0


@dataclass(frozen=True)
class Outputs:
    """What one runtime (PyTorch or ONNX Runtime) said on the probes: each case's outputs, and with
    past the generated tokens and each step's logits."""

    cases: tuple[dict[str, Array], ...]
    generated: Array | None = None
    step_logits: tuple[Array, ...] = ()


def _positions(mask: Array) -> Array:
    """Position ids as transformers' generate derives them from a (left-)padded attention mask."""
    pos = np.cumsum(mask, axis=-1) - 1
    pos[mask == 0] = 1
    return pos.astype(np.int64)


def _encode(tokenizer: Any, texts: tuple[str, ...], side: str, max_length: int) -> dict[str, Array]:
    tokenizer.padding_side = side
    enc = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="np")
    return {k: np.asarray(v, dtype=np.int64) for k, v in enc.items()}


def probes(model: Any, tokenizer: Any, sig: Signature) -> Probes:
    """Tokenize the verification batches (and the generation prompts, with past) for this graph's inputs."""
    limit = min(MAX_TOKENS, int(getattr(model.config, "max_position_embeddings", MAX_TOKENS) or MAX_TOKENS))
    cases = []
    for texts, side in BATCHES:
        enc = _encode(tokenizer, texts, side, limit)
        feeds = {n: enc[n] for n in sig.inputs if n in enc}
        if "position_ids" in sig.inputs:
            feeds["position_ids"] = _positions(feeds["attention_mask"])
        batch, length = feeds["input_ids"].shape
        padding = f"{side}-padded" if (feeds["attention_mask"] == 0).any() else "no padding"
        cases.append(Case(f"batch {batch} x {length} tokens, {padding}", feeds))
    if not sig.with_past:
        return Probes(tuple(cases))
    eos = model.generation_config.eos_token_id if model.generation_config.eos_token_id is not None else \
        model.config.eos_token_id
    eos_ids = tuple(int(e) for e in (eos if isinstance(eos, list) else [] if eos is None else [eos]))
    prompts = _encode(tokenizer, TEXTS[0:2], "left", limit - GENERATE_TOKENS)
    return Probes(tuple(cases), prompts, eos_ids, int(tokenizer.pad_token_id))


def reference(model: Any, sig: Signature, probe: Probes) -> Outputs:
    """Run the transformers model on the probes in PyTorch, in float32 (a float16 model one module at a time, see
    upcast.py), and generate, with past."""
    with upcast.float32(model):
        return _reference(model, sig, probe)


def _reference(model: Any, sig: Signature, probe: Probes) -> Outputs:
    import torch

    outputs = []
    for case in probe.cases:
        # Encoders such as DistilBERT take no use_cache argument.
        extra: dict[str, Any] = {"use_cache": sig.with_past} if sig.task == "text-generation" else {}
        if sig.with_past:
            import transformers

            extra[cache_kwarg(model)] = transformers.DynamicCache()
        with torch.no_grad():
            out = model(**{k: torch.from_numpy(v) for k, v in case.feeds.items()}, **extra)
        got = {sig.outputs[0]: (out.logits if sig.task == "text-generation" else out.last_hidden_state).numpy()}
        if sig.with_past:
            for i, layer in enumerate(cache_of(out).layers):
                got[f"present.{i}.key"], got[f"present.{i}.value"] = layer.keys.numpy(), layer.values.numpy()
        outputs.append(got)
    if not sig.with_past:
        return Outputs(tuple(outputs))
    generated, logits = _generate(model, probe)
    return Outputs(tuple(outputs), generated, logits)


def _generate(model: Any, probe: Probes) -> tuple[Array, tuple[Array, ...]]:
    """transformers' own greedy generation: the sequence the ONNX model must reproduce token for token."""
    import torch

    # Plain greedy decoding: none of the checkpoint's sampling or repetition settings (see plain_greedy).
    with torch.no_grad(), plain_greedy(model):  # (the caller keeps transformers quiet: this may run in a thread)
        out = model.generate(**{k: torch.from_numpy(v) for k, v in probe.prompts.items()}, do_sample=False,
                             max_new_tokens=GENERATE_TOKENS, eos_token_id=list(probe.eos) or None,
                             pad_token_id=probe.pad, return_dict_in_generate=True, output_logits=True)
    generated = out.sequences[:, probe.prompts["input_ids"].shape[1]:].numpy()
    return generated, tuple(t.numpy() for t in out.logits)


def session(path: Path, provider: str, half: bool = False) -> Any:
    """An ONNX Runtime session on the written files, on one execution provider.

    On CUDA, float32 stays float32 (no TF32, which rounds matmul inputs to a 10-bit mantissa), and
    what CUDA cannot run falls back to the CPU, as in a serving session. A float16 graph (`half`) on
    the CPU runs unoptimized and without the memory arena: the CPU provider computes most float16
    ops in float32, and its constant folding would store a float32 copy of every weight (a 7B: 30 GB);
    unfolded, each weight is cast as its node runs and the weights stay mapped from the data file.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if half and provider == "CPUExecutionProvider":
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.enable_cpu_mem_arena = False
    providers: list[Any] = [provider]
    if provider == GPU_PROVIDER:
        providers = [(GPU_PROVIDER, {"use_tf32": "0"}), "CPUExecutionProvider"]
    # No silent fallback: ONNX Runtime would otherwise retry a failed provider on the CPU (printing to stdout).
    return ort.InferenceSession(str(path / MODEL_FILE), options, providers=providers, enable_fallback=0)


def gpu_session(path: Path) -> tuple[Any | None, str]:
    """A session on ONNX Runtime's CUDA provider where there is one and a device it can use, or why not."""
    import onnxruntime as ort

    if GPU_PROVIDER not in ort.get_available_providers():
        return None, f"onnxruntime has no {GPU_PROVIDER} (onnxruntime-gpu is not installed)"
    try:
        sess = session(path, GPU_PROVIDER)
    except Exception as e:  # noqa: BLE001  (ONNX Runtime raises its own types; the reason is recorded)
        return None, f"the CUDA provider did not start: {str(e).splitlines()[0] if str(e) else type(e).__name__}"
    if GPU_PROVIDER not in sess.get_providers():  # its library loaded, but it found no device
        return None, "onnxruntime-gpu found no usable CUDA device"
    return sess, ""


def _empty_past(sess: Any, sig: Signature, batch: int) -> dict[str, Array]:
    types = {i.name: np.float16 if i.type == "tensor(float16)" else np.float32 for i in sess.get_inputs()}
    return {n: np.zeros((batch, sig.kv_heads, 0, sig.head_dim), dtype=types[n]) for n in sig.past_inputs}


def _rows(x: Array, mask: Array, seq_axis: int) -> Array:
    """The vectors of the real tokens: (tokens, features)."""
    moved = np.moveaxis(x, seq_axis, 1)
    picked: Array = moved[mask.astype(bool)].reshape(int(mask.sum()), -1).astype(np.float64)
    return picked


def compare(name: str, got: Array, ref: Array, mask: Array) -> dict[str, float]:
    """Differences of one output on the real tokens, and its non-finite values anywhere."""
    metrics = {f"{name}.nonfinite": float(np.size(got) - np.isfinite(got).sum())}
    if got.shape != ref.shape:
        return {**metrics, f"{name}.shape_mismatch": 1.0}
    a, b = _rows(got, mask, 2 if name.startswith("present.") else 1), _rows(ref, mask, 2 if "present." in name else 1)
    # PyTorch's only on real tokens: a fully masked (padded) row may be NaN in a correct model's attention.
    metrics[f"{name}.reference_nonfinite"] = float(b.size - np.isfinite(b).sum())
    diff = np.abs(a - b)
    max_abs = float(diff.max(initial=0.0)) if np.isfinite(diff).all() else float("inf")
    scale = float(np.abs(b).max(initial=0.0))
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    cosine = np.where(norms > 0, (a * b).sum(axis=1) / np.maximum(norms, 1e-300), 1.0)
    metrics |= {
        f"{name}.max_abs_diff": max_abs,
        f"{name}.max_rel_diff": max_abs / scale if scale > 0 else max_abs,
        f"{name}.reference_max_abs": scale,
        f"{name}.min_cosine": float(np.nan_to_num(cosine, nan=-1.0).min(initial=1.0)),
        f"{name}.mean_cosine": float(np.nan_to_num(cosine, nan=-1.0).mean()) if len(cosine) else 1.0,
    }
    if name == "logits":
        metrics[f"{name}.top1_agreement"] = float((a.argmax(axis=1) == b.argmax(axis=1)).mean())
    return metrics


def _merge(into: dict[str, float], new: dict[str, float]) -> None:
    """Worst case across batches: largest differences, smallest cosine and agreement."""
    for k, v in new.items():
        worse = min if k.endswith(("_cosine", "top1_agreement")) else max
        if k in into and not math.isnan(v):
            # NaN is the worst case: min() and max() keep whichever comes first, and would drop it.
            v = into[k] if math.isnan(into[k]) else worse(into[k], v)
        into[k] = v


def _greedy(sess: Any, sig: Signature, probe: Probes) -> tuple[Array, list[Array]]:
    """Greedy decoding through the ONNX model with its KV cache, stopping rows as generate does."""
    ids, mask = probe.prompts["input_ids"], probe.prompts["attention_mask"]
    positions = _positions(mask)
    batch = ids.shape[0]
    past = _empty_past(sess, sig, batch)
    done = np.zeros(batch, dtype=bool)
    tokens, logits = [], []
    for _ in range(GENERATE_TOKENS):
        out = dict(zip(sig.outputs, sess.run(list(sig.outputs), {"input_ids": ids, "attention_mask": mask,
                                                                 "position_ids": positions, **past}), strict=True))
        step = out["logits"][:, -1].astype(np.float32)
        logits.append(step)
        nxt = np.where(done, probe.pad, step.argmax(axis=-1)).astype(np.int64)
        tokens.append(nxt)
        done |= np.isin(nxt, probe.eos)
        if done.all():
            break
        past = {p: out["present." + p.removeprefix("past_key_values.")] for p in sig.past_inputs}
        ids, positions = nxt[:, None], positions[:, -1:] + 1
        mask = np.concatenate([mask, np.ones((batch, 1), dtype=np.int64)], axis=1)
    return np.stack(tokens, axis=1), logits


def run(sess: Any, sig: Signature, probe: Probes) -> Outputs:
    """Run a session of the written model on the probes (and generate through its KV cache, with past)."""
    outputs = []
    for case in probe.cases:
        feeds = {**case.feeds, **(_empty_past(sess, sig, case.feeds["input_ids"].shape[0]) if sig.with_past else {})}
        outputs.append(dict(zip(sig.outputs, sess.run(list(sig.outputs), feeds), strict=True)))
    if not sig.with_past:
        return Outputs(tuple(outputs))
    tokens, logits = _greedy(sess, sig, probe)
    return Outputs(tuple(outputs), tokens, tuple(logits))


def _metrics(ran: Outputs, ref: Outputs, probe: Probes, sig: Signature) -> dict[str, float]:
    """Every output's differences on every case (worst case kept), and the generation's."""
    metrics: dict[str, float] = {}
    for case, got, want in zip(probe.cases, ran.cases, ref.cases, strict=True):
        for name in sig.outputs:
            _merge(metrics, compare(name, got[name], want[name], case.feeds["attention_mask"]))
    if ref.generated is not None and ran.generated is not None:
        tokens, logits = ran.generated, ran.step_logits
        same = tokens.shape == ref.generated.shape and bool((tokens == ref.generated).all())
        steps = min(len(logits), len(ref.step_logits))
        metrics["generation.tokens"] = float(ref.generated.size)
        metrics["generation.tokens_equal"] = float(same)
        metrics["generation.nonfinite"] = float(sum(np.size(x) - np.isfinite(x).sum() for x in logits))
        if steps:
            # np.max, not max(): a NaN step must not be dropped.
            metrics["generation.logits.max_abs_diff"] = float(np.max(
                [np.abs(logits[i] - ref.step_logits[i]).max() for i in range(steps)]))
            metrics["generation.logits.reference_max_abs"] = float(np.max(
                [np.abs(ref.step_logits[i]).max() for i in range(steps)]))
    return metrics


def weight_problems(nonfinite: dict[str, dict[str, int]], limit: int = 10) -> tuple[list[str], dict[str, float]]:
    """One line per tensor with NaN or Inf values (`{"source tensor": {name: count}, ...}`), and their totals."""
    lines = [f"{what} {name} has {n} NaN/Inf value{'s' * (n != 1)}"
             for what, found in nonfinite.items() for name, n in found.items()]
    totals = {f"weights.{what.replace(' ', '_')}_nonfinite": float(sum(found.values()))
              for what, found in nonfinite.items()}
    return lines[:limit] + ([f"and {len(lines) - limit} more"] if len(lines) > limit else []), totals


def verify(runs: dict[str, Outputs], ref: Outputs, probe: Probes, sig: Signature, precision: str,
           source: SourceInfo, versions: dict[str, str], gpu_note: str = "",
           nonfinite: dict[str, dict[str, int]] | None = None) -> Verification:
    """Judge each provider's outputs against PyTorch's by the precision's thresholds (CUDA's metrics: `cuda.*`);
    any count in `nonfinite` (NaN/Inf in the source's tensors, NaN in the written initializers) fails too."""
    limits = THRESHOLDS[precision]
    weights, metrics = weight_problems(nonfinite or {})
    for provider, ran in runs.items():
        prefix = GPU_PREFIX if provider == GPU_PROVIDER else ""
        metrics |= {prefix + k: v for k, v in _metrics(ran, ref, probe, sig).items()}
    inputs = [c.label for c in probe.cases]
    if ref.generated is not None:
        inputs.append(f"greedy generation of {GENERATE_TOKENS} tokens from {ref.generated.shape[0]} "
                      f"left-padded prompts through the KV cache")
    where = ", ".join(p + (f" (metrics {GPU_PREFIX}*)" if p == GPU_PROVIDER else "") for p in runs)
    if GPU_PROVIDER not in runs:
        where += f"; not on CUDA: {gpu_note or 'not run'}"
    problems, tolerance = judge(metrics, limits)
    problems = weights + problems
    tolerance |= {k: 0.0 for k in metrics if k.startswith("weights.")}
    return Verification(
        status="failed" if problems else "passed",
        method=(f"ONNX Runtime {versions.get('onnxruntime', '?')} ({where}) against PyTorch "
                f"{versions.get('torch', '?')} / transformers {versions.get('transformers', '?')} float32"
                f"{' (over the float16 weights, one module at a time)' if precision == 'fp16' else ''} on the "
                "model's own tokens; differences over real (unmasked) tokens, NaN/Inf anywhere in ONNX Runtime's "
                "outputs, in PyTorch's on real tokens or in a source tensor fails, and NaN in a written initializer; "
                f"{precision} thresholds"),
        reference=f"{source.repo}@{source.commit}",
        inputs=tuple(inputs),
        metrics={k: round(v, 9) if np.isfinite(v) else v for k, v in sorted(metrics.items())},
        tolerance=tolerance,
        detail="; ".join(problems[:12]) or None,
    )


def judge(metrics: dict[str, float], limits: Thresholds) -> tuple[list[str], dict[str, float]]:
    """The problems (empty when it passes) and the tolerances that applied."""
    problems: list[str] = []
    tolerance: dict[str, float] = {}
    for key, value in metrics.items():
        if key.endswith(".nonfinite"):
            tolerance[key] = 0.0
            if value:
                problems.append(f"{key.removesuffix('.nonfinite')} has {value:.0f} NaN/Inf values")
        elif key.endswith(".reference_nonfinite"):
            tolerance[key] = 0.0
            if value:
                problems.append(f"PyTorch's {key.removesuffix('.reference_nonfinite')} has {value:.0f} NaN/Inf "
                                "values on real tokens")
        elif key.endswith(".shape_mismatch"):
            problems.append(f"{key.removesuffix('.shape_mismatch')} has the wrong shape")
        elif key.endswith(".max_abs_diff") and limits.max_abs is not None:
            scale = metrics.get(key.removesuffix(".max_abs_diff") + ".reference_max_abs", 0.0)
            bound = limits.max_abs + limits.rel * (scale if np.isfinite(scale) else 0.0)
            tolerance[key] = bound
            if not value <= bound:  # NaN fails too
                problems.append(f"{key} = {value:.3g} > {bound:.3g} ({limits.max_abs:g} + {limits.rel:g} x "
                                f"max |reference| {scale:.3g})")
        elif key.endswith(".min_cosine") and limits.min_cosine is not None:
            tolerance[key] = limits.min_cosine
            if not value >= limits.min_cosine:
                problems.append(f"{key} = {value:.6g} < {limits.min_cosine:g}")
        elif key.endswith(".mean_cosine") and limits.mean_cosine is not None:
            tolerance[key] = limits.mean_cosine
            if not value >= limits.mean_cosine:
                problems.append(f"{key} = {value:.6g} < {limits.mean_cosine:g}")
        elif key.endswith(".top1_agreement") and limits.min_top1 is not None:
            tolerance[key] = limits.min_top1
            if not value >= limits.min_top1:
                problems.append(f"{key} = {value:.3g} < {limits.min_top1:g}")
        elif key.endswith("generation.tokens_equal") and limits.exact_generation:
            tolerance[key] = 1.0
            if value != 1.0:
                problems.append(f"{key}: greedy generation through the KV cache differs from transformers' generate")
    return problems, tolerance
