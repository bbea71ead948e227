"""The child process that holds a GGUF file in llama.cpp for `mreg check`: one JSON request a line, one answer a line.

Run as `python -m converters.gguf.worker FILE N_CTX`. It answers on the stdout it was started
with; llama.cpp's own output goes to stderr (fd 1 is pointed there), so nothing native can
corrupt the protocol. Requests: {"op": "tokens", "text"}, {"op": "generate", "prompt",
"max_new_tokens"}, {"op": "close"}. The first line it writes describes the loaded model.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from converters.gguf.llama import SETTINGS, load


def serve(path: Path, n_ctx: int, requests: TextIO, answers: TextIO) -> None:
    """Load the file, describe it, then answer requests until `close` or end of input."""
    import llama_cpp

    llm = load(path, n_ctx=n_ctx, seed=0, n_threads=max(1, min(2, os.cpu_count() or 1)))

    meta: dict[str, str] = dict(llm.metadata)
    prefix = "tokenizer.chat_template."
    _answer(answers, {"runtime_version": f"llama-cpp-python {llama_cpp.__version__} ({_settings()})",
                      "context_length": int(llm.n_ctx()),
                      "template": meta.get("tokenizer.chat_template"),
                      "templates": {k[len(prefix):]: v for k, v in meta.items() if k.startswith(prefix)},
                      "special_tokens": special_tokens(llm, meta)})
    for line in requests:
        req = json.loads(line)
        if req["op"] == "close":
            break
        templated = bool(req.get("templated"))
        if req["op"] == "tokens":
            _answer(answers, {"count": len(_tokens(llm, req["text"], templated))})
        elif req["op"] == "generate":
            llm.reset()
            t0 = time.perf_counter()
            out = llm.create_completion(_tokens(llm, req["prompt"], templated), max_tokens=req["max_new_tokens"],
                                        temperature=0.0, top_k=1, seed=0, repeat_penalty=1.0)
            usage = out.get("usage", {})
            _answer(answers, {"text": out["choices"][0]["text"], "prompt_tokens": int(usage.get("prompt_tokens", 0)),
                              "output_tokens": int(usage.get("completion_tokens", 0)),
                              "seconds": time.perf_counter() - t0})
    llm.close()


def _tokens(llm: Any, text: str, templated: bool) -> list[int]:
    """The ids of a prompt: BOS added as the model asks, except to a rendered chat (its template wrote it)."""
    return list(llm.tokenize(text.encode(), add_bos=not templated, special=True))


#: transformers' special-token names -> the middle of their GGUF id key (llama.cpp spells "seperator" so).
_SPECIAL_KEYS = {"bos_token": "bos", "eos_token": "eos", "unk_token": "unknown", "sep_token": "seperator",
                 "pad_token": "padding", "cls_token": "cls", "mask_token": "mask"}


def special_tokens(llm: Any, meta: dict[str, str]) -> dict[str, str]:
    """The text of each special token the file names, under transformers' names (what chat templates read).

    Only the ids the file records: a tokenizer without, say, a BOS token leaves `bos_token` undefined
    in transformers, and llama.cpp's own default id would put a token there that the model never had.
    """
    found: dict[str, str] = {}
    for name, key in _SPECIAL_KEYS.items():
        value = meta.get(f"tokenizer.ggml.{key}_token_id")
        if value is not None and 0 <= int(value) < llm.n_vocab():
            found[name] = llm.detokenize([int(value)], special=True).decode("utf-8", errors="replace")
    return found


def _settings() -> str:
    return ", ".join(f"{k}={v}" for k, v in SETTINGS.items())


def _answer(out: TextIO, doc: dict[str, Any]) -> None:
    out.write(json.dumps(doc) + "\n")
    out.flush()


def main(argv: list[str]) -> int:
    """Keep the protocol's stdout for answers; send fd 1 (where native code prints) to stderr."""
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    serve(Path(argv[0]), int(argv[1]), sys.stdin, answers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
