"""What a model says about itself (architecture, context length, tokenizer, KV-cache bytes per token), read from
its source config."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from manifests import ModelInfo, SourceInfo
from registry.convert.kvcache import kv_cache_of

CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.txt", "vocab.json", "merges.txt",
                   "tokenizer_config.json", "special_tokens_map.json")


def read_model_info(source: SourceInfo, file: Callable[[str], Path],
                    config: dict[str, Any] | None) -> ModelInfo | None:
    """ModelInfo from config.json (as read, None when it is not a JSON object) and tokenizer_config.json when the
    source has them."""
    paths = {f.path for f in source.files}
    if "config.json" not in paths:
        return None
    config = config or {}
    tok = _json(file("tokenizer_config.json")) if "tokenizer_config.json" in paths else {}
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else config
    context = next((int(text[k]) for k in CONTEXT_KEYS if isinstance(text.get(k), int)), None)
    max_len = tok.get("model_max_length")
    if isinstance(max_len, int) and max_len < 10**9 and (context is None or max_len < context):
        context = max_len  # the tokenizer's limit, when tighter, is what serving must respect
    archs = config.get("architectures")
    return ModelInfo(
        architecture=archs[0] if isinstance(archs, list) and archs else None,
        model_type=config.get("model_type") if isinstance(config.get("model_type"), str) else None,
        context_length=context,
        tokenizer=tok.get("tokenizer_class") if isinstance(tok.get("tokenizer_class"), str) else None,
        tokenizer_files=tuple(sorted(p for p in paths if p in TOKENIZER_FILES)),
        chat_template=bool(tok.get("chat_template")) or "chat_template.jinja" in paths,
        kv_cache=kv_cache_of(config),
    )


def _json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
