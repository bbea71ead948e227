"""Conversion: the converter protocol (`protocol`), the format table that names every converter (`formats`),
a pure plan (`plan`: order, options, the conversion key) and its execution (`execute`: stage, convert,
verify, publish), and what converters share: checked safetensors headers (`safetensors`) and chat templates
rendered as transformers renders them (`chat`); what the source config says of the model (`modelinfo`, with
its KV-cache bytes per token from `kvcache`). The registry imports no converter statically: `formats`
loads them by name."""
