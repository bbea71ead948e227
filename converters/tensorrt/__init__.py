"""The `tensorrt` format: engines built from the ONNX artifact per compute capability, their binding recorded."""
