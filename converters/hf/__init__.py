"""The `hf` format: the source snapshot itself, checked and linked; run by transformers for golden checks."""
