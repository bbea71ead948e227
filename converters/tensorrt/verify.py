"""Verification of engines: run each on a GPU of its target next to ONNX Runtime, or say it was not run.

An engine is only "passed" when it ran here on the same inputs as ONNX Runtime (min, opt and max
shapes of its profile) and agreed; built-but-not-executed engines make the artifact "unverified".
Running needs a GPU of the target, the backend's runtime and torch with CUDA (for device buffers).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from converters.tensorrt.binding import Gpu
from converters.tensorrt.build import MODULES, Profile
from manifests import Verification

#: Minimum cosine similarity of each output to ONNX Runtime's, by precision.
MIN_COSINE = {"fp32": 0.999, "fp16": 0.99}
WHO = {"onnxruntime": "ONNX Runtime", "engine": "the engine"}


def feeds(profiles: dict[str, Profile], which: int, vocab: int) -> dict[str, Any]:
    """Inputs of one profile shape (0 min, 1 opt, 2 max): token ids below `vocab`, masks of ones, positions."""
    import numpy as np

    rng = np.random.default_rng(which)
    out: dict[str, Any] = {}
    for name, shapes in profiles.items():
        shape = shapes[which]
        if "mask" in name:
            out[name] = np.ones(shape, dtype=np.int64)
        elif "position" in name:
            out[name] = np.broadcast_to(np.arange(shape[-1], dtype=np.int64), shape).copy()
        elif "type" in name:
            out[name] = np.zeros(shape, dtype=np.int64)
        elif "ids" in name:
            out[name] = rng.integers(0, vocab, size=shape, dtype=np.int64)
        else:
            out[name] = rng.standard_normal(shape).astype(np.float32)
    return out


def run_plan(backend: str, plan: bytes, inputs: dict[str, Any]) -> dict[str, Any]:
    """Execute a plan on the current GPU with torch CUDA buffers; outputs as numpy arrays."""
    import importlib

    import numpy as np
    import torch

    trt = importlib.import_module(MODULES[backend])
    runtime = trt.Runtime(trt.Logger(trt.Logger.ERROR))
    engine = runtime.deserialize_cuda_engine(plan)
    if engine is None:
        raise RuntimeError("TensorRT could not deserialize the plan on this GPU")
    context = engine.create_execution_context()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    buffers: dict[str, Any] = {}
    for name, value in inputs.items():
        buffers[name] = torch.from_numpy(np.ascontiguousarray(value)).cuda()
        context.set_input_shape(name, tuple(value.shape))
    for name in names:
        if engine.get_tensor_mode(name) == trt.TensorIOMode.OUTPUT:
            dtype = torch.float16 if engine.get_tensor_dtype(name) == trt.DataType.HALF else torch.float32
            buffers[name] = torch.empty(tuple(context.get_tensor_shape(name)), dtype=dtype, device="cuda")
    for name in names:
        context.set_tensor_address(name, buffers[name].data_ptr())
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    if not context.execute_async_v3(stream.cuda_stream):
        raise RuntimeError("execute_async_v3 failed")
    stream.synchronize()
    return {n: buffers[n].float().cpu().numpy() for n in names if n not in inputs}


def agreement(ref: Any, got: Any) -> tuple[float, dict[str, int]]:
    """Cosine of an engine's output to ONNX Runtime's (-1 when either holds NaN or Inf), and each side's NaN/Inf."""
    import numpy as np

    a, b = np.asarray(ref, np.float64).ravel(), np.asarray(got, np.float64).ravel()
    bad = {"onnxruntime": int(a.size - np.isfinite(a).sum()), "engine": int(b.size - np.isfinite(b).sum())}
    with np.errstate(all="ignore"):
        cos = float(a @ b) / max(float(np.linalg.norm(a) * np.linalg.norm(b)), 1e-30)
    # The worst agreement, not NaN: min() over the outputs would drop a NaN.
    return (cos if np.isfinite(cos) and not any(bad.values()) else -1.0), bad


def _run_target(backend: str, plan: Path, session: Any, profiles: dict[str, Profile],
                vocab: int) -> tuple[dict[str, float], list[str], list[str]]:
    """One engine against ONNX Runtime at its profile's min, opt and max shapes: metrics, problems, shapes run."""
    worst, nonfinite = 1.0, {"onnxruntime": 0, "engine": 0}
    problems: list[str] = []
    shapes: list[str] = []
    for which, label in enumerate(("min", "opt", "max")):
        x = feeds(profiles, which, vocab)
        want = dict(zip([o.name for o in session.get_outputs()], session.run(None, x), strict=True))
        got = run_plan(backend, plan.read_bytes(), x)
        for name, ref in want.items():
            cos, bad = agreement(ref, got[name])
            worst = min(worst, cos)
            for who, n in bad.items():
                nonfinite[who] += n
                problems += [f"{WHO[who]}'s {name} at the {label} shape has {n} NaN/Inf values"] * bool(n)
        shapes.append(f"{label} shape " + ", ".join(f"{k}={list(v.shape)}" for k, v in x.items()))
    metrics = {"executed": 1.0, "min_cosine": worst, **{f"{who}_nonfinite": float(n) for who, n in nonfinite.items()}}
    return metrics, problems, shapes


def verify(backend: str, engines: dict[str, Path], onnx_model: Path, profiles: dict[str, Profile], precision: str,
           gpus: Sequence[Gpu], vocab: int, reference: str) -> Verification:
    """Run every engine whose target GPU is here against ONNX Runtime; the others are recorded as not executed."""
    here = {g.compute_capability for g in gpus[:1]}
    executed = {t: p for t, p in engines.items() if t in here}
    skipped = sorted(set(engines) - set(executed))
    metrics: dict[str, float] = {f"{t}.executed": 0.0 for t in skipped}
    failures: list[str] = []
    inputs_desc: list[str] = []
    if executed:
        import onnxruntime as ort

        session = ort.InferenceSession(str(onnx_model), providers=["CPUExecutionProvider"])
        for target, plan in executed.items():
            found, problems, shapes = _run_target(backend, plan, session, profiles, vocab)
            metrics |= {f"{target}.{k}": v for k, v in found.items()}
            failures += [f"{target}: {p}" for p in problems]
            inputs_desc += [f"{target} {shape}" for shape in shapes]
            if not found["min_cosine"] >= MIN_COSINE[precision]:  # NaN fails too
                failures.append(f"{target}: min cosine {found['min_cosine']:.5f} < {MIN_COSINE[precision]}")
    why = f"this machine's GPU is {gpus[0].name} ({gpus[0].compute_capability})" if gpus else "no GPU on this machine"
    status: Literal["passed", "failed", "unverified"]
    if failures:
        status, detail = "failed", "; ".join(failures)
    elif skipped:
        status = "unverified"
        detail = (f"built but not executed: {', '.join(skipped)} ({why}); "
                  + (f"executed and compared: {', '.join(executed)}" if executed else "no engine was run"))
    else:
        status, detail = "passed", None
    return Verification(
        status=status,
        method=f"each engine run on a GPU of its target against ONNX Runtime (CPU) at the profile's min/opt/max "
               f"shapes; min cosine per output >= {MIN_COSINE[precision]} ({precision}), NaN/Inf on either side fails",
        reference=reference, inputs=tuple(inputs_desc), metrics=metrics,
        not_run=tuple(f"engine {t} not run by {'TensorRT for RTX' if backend == 'tensorrt-rtx' else 'TensorRT'}: "
                      f"{why}" for t in skipped),
        tolerance={**{f"{t}.min_cosine": MIN_COSINE[precision] for t in engines},
                   **{f"{t}.{who}_nonfinite": 0.0 for t in executed for who in ("onnxruntime", "engine")}},
        detail=detail)
