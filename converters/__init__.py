"""Converters: one package per format, each plugging into `registry.convert.protocol.Converter`.

`hf` (the identity format, with its transformers runtime), `gguf` (llama.cpp files: streaming
writer, quantizers, vocabularies, a float32 reference), `onnx` (export and ONNX Runtime
verification) and `tensorrt` (engines from the ONNX artifact, bound to GPUs). The registry
knows them only by the module names in `registry.convert.formats`; heavy libraries (torch,
tensorrt, onnxruntime, llama.cpp) are imported inside the converter that needs them.
"""
