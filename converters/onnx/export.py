"""ONNX export of Hugging Face encoders and decoder LLMs with torch.onnx, and the spec's transforms.

Two exporters trace the same thin wrapper, whose signature is the graph's: plain tensors in, plain
tensors out, past key/values flattened as `past_key_values.<layer>.key|value` inputs and
`present.<layer>.key|value` outputs (the names Optimum, ONNX Runtime GenAI and Triton ensembles use).

- TorchScript (the default): `torch.jit` tracing, about 5x faster to export. It records the Python
  branches the example input takes, so a graph is vouched for by mreg's verification (shapes,
  padding, generation through the KV cache), which runs for every export whichever the exporter.
- dynamo (`torch.export`, torch's maintained path since 2.9): proves the graph for every shape in
  its dynamic range; its symbolic-shape tracing and decomposition take 17 s of a 12-layer llama's
  export, against 3.5 s traced.

Every written model has its weights in one external data file beside the graph, whatever its size,
so small and >2 GB models have the same tree: `model.onnx` + `model.onnx.data`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from converters.hf.quiet import quiet
from converters.onnx import experts
from converters.onnx.graph import save
from registry.errors import UsageError

Task = Literal["feature-extraction", "text-generation"]
Exporter = Literal["dynamo", "torchscript"]

#: opset 18 is the one torch.onnx's translation library is written against (others go through the
#: version converter); ONNX Runtime >= 1.14, TensorRT >= 8.6 and Triton's ORT backend all run it.
OPSET = 18

ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "distilbert", "electra", "mpnet"})
DECODER_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3", "granite", "olmo2", "gemma", "gemma2",
                           "gemma3_text", "qwen3_moe", "qwen2_moe", "mixtral"})
#: Decoders whose transformers modules have no SDPA path (Gemma 2's soft-capped attention): exported eager.
EAGER_TYPES = frozenset({"gemma2"})


class UnsupportedModel(UsageError):
    """The snapshot holds a model this converter does not export."""


@dataclass(frozen=True)
class Signature:
    """The graph's interface: input and output names, and the shape of one layer's past key/values."""

    task: Task
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    layers: int = 0
    kv_heads: int = 0
    head_dim: int = 0

    @property
    def with_past(self) -> bool:
        """Whether the graph takes past key/values and returns present ones."""
        return self.layers > 0

    @property
    def past_inputs(self) -> tuple[str, ...]:
        """Names of the past key/value inputs, layer by layer, key before value."""
        return tuple(n for n in self.inputs if n.startswith("past_key_values."))


def classify(config: dict[str, Any]) -> Task:
    """The task a model is exported for, from its config.json; refuses what is not supported."""
    model_type = str(config.get("model_type", ""))
    archs = [str(a) for a in config.get("architectures") or []]
    if model_type in DECODER_TYPES:
        if archs and not any(a.endswith("ForCausalLM") for a in archs):
            raise UnsupportedModel(f"{model_type} checkpoint with architectures {archs} is not a causal LM",
                                   hint="ONNX export covers *ForCausalLM decoders (logits)")
        return "text-generation"
    if model_type in ENCODER_TYPES:
        return "feature-extraction"
    raise UnsupportedModel(
        f"model_type {model_type or '(none)'!r} is not supported by --to onnx",
        hint=f"supported: encoders {', '.join(sorted(ENCODER_TYPES))}; decoders {', '.join(sorted(DECODER_TYPES))}",
    )


def load(directory: Path, task: Task, half: bool = False, config: dict[str, Any] | None = None) -> tuple[Any, Any]:
    """Load the model in float32, or float16 with `half` (eval mode, SDPA attention where the family has it), and
    its tokenizer, from local files only (`config`: config.json when the caller has read it)."""
    import torch
    import transformers

    cls = transformers.AutoModelForCausalLM if task == "text-generation" else transformers.AutoModel
    with quiet():
        model_type = (config if config is not None else read_config(directory)).get("model_type")
        attention = "eager" if model_type in EAGER_TYPES else "sdpa"
        model = cls.from_pretrained(directory, dtype=torch.float16 if half else torch.float32,
                                    attn_implementation=attention, local_files_only=True)
        tokenizer = transformers.AutoTokenizer.from_pretrained(directory, local_files_only=True)
    model.eval()
    if tokenizer.pad_token is None:
        # Decoder tokenizers often have no pad token; generation pads with EOS the same way.
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    return model, tokenizer


def cache_kwarg(model: Any) -> str:
    """The forward() keyword that takes the KV cache: `cache` in recent transformers, `past_key_values` before."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def cache_of(output: Any) -> Any:
    """The KV cache a forward pass returned."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


def signature(model: Any, tokenizer: Any, task: Task, with_past: bool) -> Signature:
    """The graph interface for this model; for past key/values, one real forward pass tells their shape."""
    import inspect

    import torch

    if task == "feature-extraction":
        accepted = inspect.signature(model.forward).parameters
        extra = tuple(n for n in ("token_type_ids",) if n in tokenizer.model_input_names and n in accepted)
        return Signature(task, ("input_ids", "attention_mask", *extra), ("last_hidden_state",))
    base = ("input_ids", "attention_mask", "position_ids")
    if not with_past:
        return Signature(task, base, ("logits",))
    with torch.no_grad():
        out = model(input_ids=torch.tensor([[1, 2]]), use_cache=True)
    layers = list(cache_of(out).layers)
    _, kv_heads, _, head_dim = layers[0].keys.shape
    names = [f"{i}.{kind}" for i in range(len(layers)) for kind in ("key", "value")]
    return Signature(task, (*base, *(f"past_key_values.{n}" for n in names)),
                     ("logits", *(f"present.{n}" for n in names)), len(layers), int(kv_heads), int(head_dim))


def _wrapper(model: Any, sig: Signature) -> Any:
    """A module whose forward() is the graph's signature."""
    import torch

    kwarg = cache_kwarg(model)

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
            out = self.model(**dict(zip(sig.inputs, inputs, strict=True)))
            hidden: torch.Tensor = out.last_hidden_state.float()  # (a float16 model's too: callers read float32)
            return hidden

    class Decoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                    *past: torch.Tensor) -> Any:
            import transformers

            kwargs: dict[str, Any] = {"use_cache": bool(past)}
            if past:
                cache = transformers.DynamicCache()
                for i in range(sig.layers):
                    cache.update(past[2 * i], past[2 * i + 1], i)
                kwargs[kwarg] = cache
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
            logits = out.logits.float()  # a no-op in float32; a float16 model's logits are returned as float32
            if not past:
                return logits
            present = [t for layer in cache_of(out).layers for t in (layer.keys, layer.values)]
            return (logits, *present)

    wrapper = Encoder() if sig.task == "feature-extraction" else Decoder()
    return wrapper.eval()


def _example(sig: Signature, dtype: Any = None) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """Example inputs and their dynamic axes (past key/values in the model's `dtype`); sizes of 0 or 1 would be
    specialized by torch.export, so 2+."""
    import torch

    batch, seq, past = torch.export.Dim("batch"), torch.export.Dim("sequence"), torch.export.Dim("past_sequence")
    total = torch.export.Dim("total_sequence")
    b, s, p = 2, 5, 3
    ids = torch.randint(3, 50, (b, s))
    mask = torch.ones(b, s, dtype=torch.int64)
    if sig.task == "feature-extraction":
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
        # forward(*inputs): torch.export sees one tuple argument, so the axes are one nested tuple.
        return tuple(feeds[n] for n in sig.inputs), (tuple({0: batch, 1: seq} for _ in sig.inputs),)
    if not sig.with_past:
        positions = torch.arange(s).expand(b, s).contiguous()
        return (ids, mask, positions), ({0: batch, 1: seq}, {0: batch, 1: seq}, {0: batch, 1: seq})
    mask = torch.ones(b, s + p, dtype=torch.int64)
    positions = torch.arange(p, p + s).expand(b, s).contiguous()
    kv = tuple(torch.randn(b, sig.kv_heads, p, sig.head_dim, dtype=dtype) for _ in sig.past_inputs)
    # The attention mask covers past and new tokens (Dims only add integers, so it gets its own name).
    shapes = ({0: batch, 1: seq}, {0: batch, 1: total}, {0: batch, 1: seq},
              tuple({0: batch, 2: past} for _ in kv))
    return (ids, mask, positions, *kv), shapes


def export(model: Any, sig: Signature, dest: Path, exporter: Exporter) -> None:
    """Write `dest/model.onnx` + its data file, float32, with the chosen exporter."""
    if exporter == "torchscript":
        with experts.traceable(model):
            _export_torchscript(model, sig, dest)
        return
    import torch

    args, dynamic = _example(sig, model.dtype)
    with quiet(), torch.no_grad(), experts.traceable(model):
        program = torch.onnx.export(
            _wrapper(model, sig), args, dynamo=True, input_names=list(sig.inputs), output_names=list(sig.outputs),
            dynamic_shapes=dynamic, opset_version=OPSET, optimize=False, verbose=False,
        )
    if program is None:  # only the TorchScript path returns None
        raise RuntimeError("torch.onnx.export returned no program")
    cleanup(program.model)
    save(program.model_proto, dest)


def cleanup(model: Any) -> None:
    """Fold constants, drop dead nodes, share equal initializers and subexpressions, in place.

    torch.onnx's own `optimize=True` also runs onnxscript's pattern rewriter, which took a third of
    the export time of a 12-layer llama and changed nothing ONNX Runtime's session-time fusions do
    not redo (same latency measured); these passes are the cheap part of that pipeline.
    """
    import importlib

    import onnx_ir as ir
    import onnxscript.optimizer

    common: Any = importlib.import_module("onnx_ir.passes.common")  # partly untyped

    common.InlinePass()(model)
    for _ in range(2):
        onnxscript.optimizer.fold_constants(model)
        onnxscript.optimizer.remove_unused_nodes(model)
    ir.passes.Sequential(
        common.RemoveUnusedFunctionsPass(), common.RemoveUnusedOpsetsPass(),
        common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common.DeduplicateInitializersPass(), common.CommonSubexpressionEliminationPass(),
        common.OutputFixPass(), common.NameFixPass(),
    )(model)


def _axes(sig: Signature) -> dict[str, dict[int, str]]:
    """The TorchScript exporter's dynamic axes: the same names the dynamo path gets from its Dims."""
    axes: dict[str, dict[int, str]] = {}
    for name in (*sig.inputs, *sig.outputs):
        if name.startswith("past_key_values."):
            axes[name] = {0: "batch", 2: "past_sequence"}
        elif name.startswith("present."):
            axes[name] = {0: "batch", 2: "total_sequence"}
        elif name == "attention_mask" and sig.with_past:
            axes[name] = {0: "batch", 1: "total_sequence"}
        else:
            axes[name] = {0: "batch", 1: "sequence"}
    return axes


def _export_torchscript(model: Any, sig: Signature, dest: Path) -> None:
    """torch.onnx's TorchScript exporter: about 5x faster than dynamo, but it traces the example's Python branches.

    A traced graph is right for the shapes whose control flow matches the example's; mreg's
    verification (several shapes, left padding, greedy generation with the KV cache) is what vouches
    for it. transformers takes the traced path into account (e.g. it builds the attention mask
    instead of skipping it when the example has no padding).
    """
    args, _ = _example(sig, model.dtype)
    with _attention_in_half(model):
        _trace_and_write(model, sig, dest, args)


def _trace_and_write(model: Any, sig: Signature, dest: Path, args: tuple[Any, ...]) -> None:
    """Trace the graph without its weights, fold its constants, then write the weights from the model tensor by
    tensor (initializers.py): no copy of the weights beside the model's own at any point."""
    import onnx
    import onnx_ir as ir
    import torch

    from converters.onnx import initializers

    wrapper = _wrapper(model, sig)
    kept = _Kept()
    with quiet(), torch.no_grad():
        # (typed for paths, but the TorchScript exporter writes to a file object as it always has)
        torch.onnx.export(wrapper, args, kept, dynamo=False, input_names=list(sig.inputs),  # type: ignore[arg-type]
                          output_names=list(sig.outputs), dynamic_axes=_axes(sig), opset_version=OPSET,
                          export_params=False, do_constant_folding=False)
    proto = onnx.ModelProto()
    proto.ParseFromString(b"".join(kept.chunks))
    del kept
    graph = ir.serde.deserialize_model(proto)
    cleanup(graph)  # the module's tensors are graph inputs here: only what is constant without them is folded
    initializers.save(ir.serde.serialize_model(graph), initializers.module_tensors(wrapper), dest)


@contextlib.contextmanager
def _attention_in_half(model: Any) -> Iterator[None]:
    """For a float16 model, the TorchScript exporter's SDPA with its scale in float16 too.

    transformers passes the scale as a Python float, which the exporter's SDPA writes as a float32
    constant; type promotion then runs the attention and the output projection after it in float32,
    folding a float32 copy of every o_proj weight into the graph (a 7B: 1.4 GB more file and memory).
    """
    import torch

    if model.dtype != torch.float16:
        yield
        return
    from torch.onnx._internal.torchscript_exporter import _type_utils, symbolic_helper, symbolic_opset14

    builtin = symbolic_opset14.scaled_dot_product_attention

    def symbolic(g: Any, query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: Any = None,
                 is_causal: Any = None, scale: Any = None, enable_gqa: Any = None) -> Any:
        half = _type_utils.JitScalarType.from_value(query)
        if scale is not None and not symbolic_helper._is_none(scale):
            scale = g.op("Cast", scale, to_i=half.onnx_type())
        if attn_mask is not None and not symbolic_helper._is_none(attn_mask) and \
                _type_utils.JitScalarType.from_value(attn_mask) == _type_utils.JitScalarType.BOOL:
            # float16's lowest, not -inf: a fully masked (padding) row stays finite, as transformers' eager mask
            attn_mask = g.op("Where", attn_mask, g.op("Constant", value_t=torch.tensor([0.0], dtype=torch.float16)),
                             g.op("Constant", value_t=torch.tensor([torch.finfo(torch.float16).min],
                                                                   dtype=torch.float16)))
        return builtin(g, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

    registry: Any = torch.onnx  # (public, but not re-exported in the stubs)
    registry.register_custom_op_symbolic("aten::scaled_dot_product_attention", symbolic, OPSET)
    try:
        yield
    finally:
        registry.unregister_custom_op_symbolic("aten::scaled_dot_product_attention", OPSET)


def release(model: Any) -> None:
    """Free the memory of the model's weights now, however many references to them remain.

    (The tracer's caches, detached aliases of the weights and the cycles that the conversion's frozen
    collector skips would otherwise keep them alive while ONNX Runtime verifies: measured at 3 B, the
    whole 5.7 GiB.) Each storage is resized to nothing, which frees it under every alias; one that
    cannot be resized (memory-mapped) is dropped from its tensor instead. The model is unusable afterwards.
    """
    import torch

    for tensor in (*model.parameters(), *model.buffers()):
        with contextlib.suppress(RuntimeError):  # (a storage that is not resizable)
            tensor.untyped_storage().resize_(0)
        tensor.data = torch.empty(0, dtype=tensor.dtype)


class _Kept:
    """A write-only file that keeps the bytes objects written to it instead of copying them into a buffer."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: Any, /) -> int:
        """Keep `data` (a copy only when it is not an immutable bytes object)."""
        self.chunks.append(data if isinstance(data, bytes) else bytes(data))
        return len(self.chunks[-1])

    def flush(self) -> None:
        """Nothing is buffered."""


def read_config(directory: Path) -> dict[str, Any]:
    """config.json of the snapshot, or a clear refusal."""
    path = directory / "config.json"
    if not path.is_file():
        raise UnsupportedModel("the snapshot has no config.json", hint="ONNX export needs a transformers checkpoint")
    config: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return config
