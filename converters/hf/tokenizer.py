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

    def count_tokens(self, text: str, templated: bool = False) -> int:
        """Tokens of a text, with the special tokens the tokenizer adds (none for a rendered chat)."""
        return len(self.tokenizer(text, add_special_tokens=not templated)["input_ids"])

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """Render with transformers' own apply_chat_template, tools passed through.

        transformers stays the renderer here rather than mreg's copy (registry.convert.chat, which GGUF
        uses): the hf runtime is the reference the other formats are judged against, so it renders
        what a transformers user gets, chosen template (`tool_use` when tools are given) and special
        tokens included; the tests hold mreg's copy equal to it. Its failures become one UsageError line.
        """
        from registry.convert import chat

        template = getattr(self.tokenizer, "chat_template", None)
        if not template:
            raise UsageError("this model has no chat template", hint="use `prompt` instead of `messages` in the case")
        if isinstance(template, dict):  # named templates: transformers takes `tool_use` for tools, else `default`
            template = template.get("tool_use" if tools is not None else "default") or template.get("default")
        if isinstance(template, str):
            # transformers' render has no time or size budget: mreg's copy renders first under one, and a template
            # that runs past it is refused before transformers runs it (any other refusal is transformers' to make).
            special = {n: getattr(self.tokenizer, n, None) for n in chat.SPECIAL_TOKEN_NAMES}
            try:
                chat.render(template, messages, tools=tools, add_generation_prompt=True,
                            special_tokens={n: v for n, v in special.items() if isinstance(v, str)})
            except chat.BudgetExceeded:
                raise
            except UsageError:
                pass
        try:
            text: str = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                           add_generation_prompt=True)
        except Exception as e:  # the template is a program from the model's repository: what it raises (its
            # raise_exception, an undefined attribute, a TypeError) is its refusal of this case.
            raise chat.failure(e) from e
        return text
