"""The `onnx` format: export with torch, verify in ONNX Runtime against PyTorch, run for golden checks."""
