"""The ONNX files of an artifact: `model.onnx` with its weights in `model.onnx.data`, and the transforms
(int8, ONNX Runtime's optimizer) that rewrite them; heavy libraries imported inside each. (fp16 is not a
transform: the model is exported from PyTorch in float16, see export.py.)"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from converters.hf.quiet import quiet

#: The IR that the dynamo exporter writes for opset 18. onnx >= 1.23 stamps newer IRs on anything it
#: builds, which older runtimes refuse (onnxruntime 1.31 reads at most IR 13), and the TorchScript
#: exporter an older one: every saved model is stamped with this one; ONNX Runtime >= 1.17 reads it.
IR_VERSION = 10
MODEL_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
#: Tensors below this many bytes stay inside the graph (shapes, small constants); weights go to DATA_FILE.
EXTERNAL_MIN_BYTES = 1024


def save(proto: Any, dest: Path, check: bool = True) -> Path:
    """Write a model as `dest/model.onnx` + `dest/model.onnx.data`, stamped with IR_VERSION, and check it.

    `check=False` is for ONNX Runtime's optimized graphs: their fused ops (e.g. SimplifiedLayerNormalization)
    are ONNX Runtime's own, which onnx's checker does not know; the verification session loads them instead.
    """
    import onnx

    dest.mkdir(parents=True, exist_ok=True)
    for name in (MODEL_FILE, DATA_FILE):
        (dest / name).unlink(missing_ok=True)
    proto.ir_version = IR_VERSION  # the TorchScript exporter writes IR 8, onnx's transforms up to 14
    onnx.save_model(proto, dest / MODEL_FILE, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=DATA_FILE, size_threshold=EXTERNAL_MIN_BYTES, convert_attribute=False)
    if not (dest / DATA_FILE).exists():
        (dest / DATA_FILE).touch()  # a model without large tensors still has the documented tree
    if check:
        onnx.checker.check_model(str(dest / MODEL_FILE))
    return dest / MODEL_FILE


def load_proto(src: Path) -> Any:
    """A saved model with its external data in memory."""
    import onnx

    return onnx.load_model(src / MODEL_FILE, load_external_data=True)


def quantize_int8(src: Path, dest: Path) -> None:
    """ONNX Runtime dynamic quantization: MatMul weights to int8 per channel, activations quantized at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory(prefix=".quant-", dir=dest.parent) as tmp, quiet():
        out = Path(tmp) / MODEL_FILE
        # Embedding lookups (Gather) and the rest stay float: int8 there costs accuracy for little size.
        quantize_dynamic(src / MODEL_FILE, out, weight_type=QuantType.QInt8, per_channel=True,
                         op_types_to_quantize=["MatMul"], use_external_data_format=True)
        save(load_proto(Path(tmp)), dest)


def optimize(src: Path, dest: Path, provider: str) -> None:
    """ONNX Runtime offline graph optimization (extended level: fusions for `provider`); saved, not just applied."""
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix=".opt-", dir=dest.parent) as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        options.optimized_model_filepath = str(Path(tmp) / MODEL_FILE)
        options.add_session_config_entry("session.optimized_model_external_initializers_file_name", DATA_FILE)
        options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes",
                                         str(EXTERNAL_MIN_BYTES))
        options.log_severity_level = 3
        ort.InferenceSession(str(src / MODEL_FILE), options, providers=[provider])
        save(load_proto(Path(tmp)), dest, check=False)


#: ONNX TensorProto element types that can hold NaN or Inf -> the safetensors dtype with the same bits.
FLOAT_TYPES = {1: "F32", 10: "F16", 11: "F64", 16: "BF16", 17: "F8_E4M3", 19: "F8_E5M2"}


def nan_initializers(directory: Path) -> dict[str, int]:
    """Initializer name -> its NaN count (only those with any) in a saved model; external data read in chunks.

    NaN only: ONNX Runtime's optimizer folds attention masks into constants of -Inf, which a correct graph
    holds; an Inf weight is found in the source (and fp16 conversion clamps to F16's range).
    """
    import numpy as np
    import onnx
    from onnx import numpy_helper
    from onnx.external_data_helper import ExternalDataInfo

    from converters.hf.weights import Extent, count_extents

    proto = onnx.load_model(directory / MODEL_FILE, load_external_data=False)
    found: dict[str, int] = {}
    extents = []
    for t in proto.graph.initializer:
        if t.data_type not in FLOAT_TYPES:
            continue
        if t.data_location != onnx.TensorProto.EXTERNAL:
            values = numpy_helper.to_array(t).astype(np.float64)  # exact for every float type
            if n := int(np.count_nonzero(np.isnan(values))):
                found[t.name] = n
            continue
        info = ExternalDataInfo(t)
        path = directory / info.location
        start = info.offset or 0
        stop = start + (info.length if info.length is not None else path.stat().st_size - start)
        extents.append(Extent(t.name, path, FLOAT_TYPES[t.data_type], start, min(stop, path.stat().st_size)))
    return found | count_extents(extents, nan_only=True)


def describe(path: Path) -> dict[str, Any]:
    """Opset, IR version, domains, I/O (names, element types, dims) and initializer bytes of a saved graph, without
    its weights."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    proto = onnx.load_model(path, load_external_data=False)

    def io(values: Any) -> dict[str, Any]:
        return {v.name: {"type": onnx.TensorProto.DataType.Name(v.type.tensor_type.elem_type).lower(),
                         "shape": [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]}
                for v in values}

    def nbytes(t: Any) -> int:
        length = next((e.value for e in t.external_data if e.key == "length"), None)
        if length is not None:
            return int(length)
        if t.data_location == onnx.TensorProto.EXTERNAL or t.raw_data:  # external without a length: from the dims
            itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
            return len(t.raw_data) or int(np.prod(t.dims, dtype=np.int64)) * itemsize
        return int(numpy_helper.to_array(t).nbytes)

    return {
        "initializer_bytes": sum(nbytes(t) for t in proto.graph.initializer),
        "ir_version": proto.ir_version,
        "opsets": {o.domain or "ai.onnx": o.version for o in proto.opset_import},
        "inputs": io(proto.graph.input),
        "outputs": io(proto.graph.output),
    }
