"""A graph traced without its weights, then given them one tensor at a time: the export's peak is the model's own.

The TorchScript exporter, asked for the weights (`export_params=True`), holds copies of them while
it folds constants and builds and writes the graph (about 2.4 x the float16 weights over 2 GB, 4.5 x
under). Traced with `export_params=False` and its constant folding off, it keeps none: the module's
parameters and buffers become graph inputs named as in its state dict, and the graph is only its
nodes. Then, without any weight:

- plan (pure): each such input becomes an initializer; a `Transpose` that reads one (a linear
  layer's weight, as MatMul wants it) is folded into an initializer of its own, the transposed
  tensor, as the exporter's constant folding did (a tied embedding keeps both: the Gather table and
  the transposed output projection);
- execute: the tensors are written from the loaded model into `model.onnx.data`, one at a time
  (a transposed one is the only copy, of one tensor), large ones at 64 KiB-aligned offsets so that
  ONNX Runtime can map them, and the graph records where each one lies.

The values are the model's own, bit for bit (whatever transformers did to load them: a bf16
checkpoint rounded to float16, a family's renamed or stacked tensors, tied weights once).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

#: Tensors at least this large start at a multiple of ALIGNMENT in the data file (onnx's own save does the same).
ALIGN_MIN_BYTES = 1 << 20
ALIGNMENT = 1 << 16


@dataclass(frozen=True)
class Initializer:
    """One initializer to write: its name in the graph, the module tensor it holds, and a folded Transpose's perm."""

    name: str
    source: str
    perm: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Layout:
    """The plan: initializers to write, and the graph inputs and Transpose nodes they replace."""

    initializers: tuple[Initializer, ...]
    inputs: frozenset[str]
    folded: frozenset[str]


def plan(graph: Any, sources: Iterable[str]) -> Layout:
    """Which initializers a weightless graph needs: its inputs named like a module tensor (`sources`), and each
    Transpose of one folded into its own."""
    wanted = set(sources)
    inputs = frozenset(i.name for i in graph.input if i.name in wanted)
    consumers: dict[str, list[Any]] = {name: [] for name in inputs}
    for node in graph.node:
        for name in node.input:
            if name in consumers:
                consumers[name].append(node)
    out: list[Initializer] = []
    folded: set[str] = set()
    for name in sorted(inputs):
        direct = False
        for node in consumers[name]:
            if node.op_type == "Transpose" and len(node.input) == 1:
                perm = next((tuple(a.ints) for a in node.attribute if a.name == "perm"), None)
                out.append(Initializer(node.output[0], name, perm or ()))
                folded.add(node.output[0])
            else:
                direct = True
        if direct:
            out.append(Initializer(name, name))
    return Layout(tuple(out), inputs, frozenset(folded))


def _onnx_type(dtype: Any) -> int:
    """The ONNX element type of a torch dtype."""
    import onnx
    import torch

    types = {torch.float32: onnx.TensorProto.FLOAT, torch.float16: onnx.TensorProto.FLOAT16,
             torch.bfloat16: onnx.TensorProto.BFLOAT16, torch.float64: onnx.TensorProto.DOUBLE,
             torch.int64: onnx.TensorProto.INT64, torch.int32: onnx.TensorProto.INT32,
             torch.int8: onnx.TensorProto.INT8, torch.uint8: onnx.TensorProto.UINT8, torch.bool: onnx.TensorProto.BOOL}
    return types[dtype]


def tensor_of(entry: Initializer, tensors: Mapping[str, Any]) -> Any:
    """The values of one initializer: its module tensor, transposed if a Transpose was folded into it."""
    tensor = tensors[entry.source].detach()
    if entry.perm is not None:
        perm = entry.perm or tuple(reversed(range(tensor.dim())))  # ONNX's default: reverse the axes
        tensor = tensor.permute(perm)
    return tensor.contiguous()


def save(proto: Any, tensors: Mapping[str, Any], dest: Path) -> Path:
    """Write a weightless graph whose inputs include module tensors (`tensors`, by state-dict name) as `model.onnx` +
    `model.onnx.data` in `dest`, those tensors as its initializers; stamped and checked like graph.save()."""
    import onnx

    from converters.onnx.graph import DATA_FILE, EXTERNAL_MIN_BYTES, IR_VERSION, MODEL_FILE

    layout = plan(proto.graph, tensors)
    dest.mkdir(parents=True, exist_ok=True)
    for name in (MODEL_FILE, DATA_FILE):
        (dest / name).unlink(missing_ok=True)
    apply(proto, layout, tensors, dest / DATA_FILE, EXTERNAL_MIN_BYTES)
    proto.ir_version = IR_VERSION
    onnx.save_model(proto, dest / MODEL_FILE)
    onnx.checker.check_model(str(dest / MODEL_FILE))
    return dest / MODEL_FILE


def apply(proto: Any, layout: Layout, tensors: Mapping[str, Any], data: Path, inline_max: int) -> None:
    """Write the planned initializers (from `tensors`, the module's by name), and every initializer the graph already
    holds of at least `inline_max` bytes, into the file `data`, and turn `proto` into the graph that reads them."""
    graph = proto.graph
    kept = [n for n in graph.node if not (n.op_type == "Transpose" and n.output[0] in layout.folded)]
    del graph.node[:]
    graph.node.extend(kept)
    inputs = [i for i in graph.input if i.name not in layout.inputs]
    del graph.input[:]
    graph.input.extend(inputs)
    data_file = data.name
    with open(data, "wb") as out:
        for t in graph.initializer:  # constants the exporter lifted (small: shapes, rotary frequencies, masks)
            if t.HasField("raw_data") and len(t.raw_data) >= inline_max:
                _locate(t, data_file, *_write(out, memoryview(t.raw_data)))
                t.ClearField("raw_data")
        for entry in layout.initializers:
            tensor = tensor_of(entry, tensors)
            t = graph.initializer.add()
            t.name, t.data_type = entry.name, _onnx_type(tensor.dtype)
            t.dims.extend(tensor.shape)
            values = _bytes(tensor)
            if len(values) < inline_max:
                t.raw_data = bytes(values)
            else:
                _locate(t, data_file, *_write(out, values))
            del tensor, values  # a transposed copy is freed before the next tensor
        out.flush()


def _bytes(tensor: Any) -> memoryview:
    """The tensor's bytes, little-endian as ONNX stores them, without a copy."""
    import torch

    return memoryview(tensor.reshape(-1).view(torch.uint8).numpy())


def _write(out: BinaryIO, data: memoryview) -> tuple[int, int]:
    """Append `data` to the data file (large tensors at an aligned offset); its offset and length."""
    offset = out.tell()
    if len(data) >= ALIGN_MIN_BYTES and offset % ALIGNMENT:
        pad = ALIGNMENT - offset % ALIGNMENT
        out.write(b"\0" * pad)
        offset += pad
    out.write(data)
    return offset, len(data)


def _locate(tensor: Any, data_file: str, offset: int, length: int) -> None:
    """Mark an initializer as stored in the data file at this offset and length."""
    import onnx

    del tensor.external_data[:]
    for key, value in (("location", data_file), ("offset", str(offset)), ("length", str(length))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value
    tensor.data_location = onnx.TensorProto.EXTERNAL


def module_tensors(module: Any) -> dict[str, Any]:
    """A module's parameters and buffers by state-dict name (tied ones under each name): what a weightless trace names
    its inputs."""
    tensors = dict(module.named_parameters(remove_duplicate=False))
    return tensors | dict(module.named_buffers(remove_duplicate=False))
