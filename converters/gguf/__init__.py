"""The `gguf` format: llama.cpp files written tensor by tensor from safetensors.

`model` plans tensors from the config and the safetensors headers, `vocab` reads tokenizers,
`mix` picks per-tensor types, `quants` encodes, `file` writes the container, `verify` checks the
result (and `reference` is the streaming float32 forward pass it is compared with), `runtime`
runs a file with llama.cpp for golden checks; `evaluation` is the text quality is measured on, `auto`
the choice of a type by budget and `chart` its SVG. A conversion: `options` (typed, prepared once), `work`
(what it prepares before the first byte), `importance` (its importance matrix), `stream` (the write);
`converter` ties them to the registry's protocol.
"""
