"""What the transformers-based runtimes share: a tokenizer's counting and chat rendering, plain greedy decoding."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from registry.errors import UsageError


@contextlib.contextmanager
def plain_greedy(model: Any) -> Iterator[None]:
    """transformers' generate() without the checkpoint's generation defaults, for the duration.

    generate() fills every setting its caller leaves unset from the model's generation_config.json;
    Qwen2.5-Instruct's sets repetition_penalty 1.05, which changes greedy tokens. Greedy decoding that
    other runtimes (ONNX Runtime, llama.cpp) must reproduce is the argmax of the logits, nothing else.
    The special token ids stay: generation still stops at the model's end-of-sequence tokens.
    """
    import transformers

    blank: Any = transformers.GenerationConfig  # an untyped constructor
    saved = model.generation_config
    keep = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")
    model.generation_config = blank(**{k: getattr(saved, k, None) for k in keep})
    try:
        yield
    finally:
        model.generation_config = saved


class HFTokenizerSession:
    """Token counting and chat rendering through a Hugging Face tokenizer (shared by the hf and onnx runners)."""

    tokenizer: Any

    def count_tokens(self, text: str) -> int:
        """Tokens of a text, with the special tokens the tokenizer adds."""
        return len(self.tokenizer(text)["input_ids"])

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """Render with the tokenizer's chat template."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise UsageError("this model has no chat template", hint="use `prompt` instead of `messages` in the case")
        text: str = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text
