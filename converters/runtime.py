"""Running an artifact: one small session protocol, one runner per format, imported on first use.

`mreg check` uses these to put golden cases through the runtime a format needs: transformers for
`hf`, llama.cpp (llama-cpp-python) for `gguf`, ONNX Runtime for `onnx`. Greedy decoding and fixed
seeds make runs repeatable.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from manifests import Artifact, Manifest
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


@dataclass(frozen=True)
class Generation:
    """Greedy continuation of a prompt."""

    text: str
    prompt_tokens: int
    output_tokens: int
    seconds: float


@dataclass(frozen=True)
class Embedding:
    """A pooled, normalized embedding of a text."""

    vector: tuple[float, ...]
    prompt_tokens: int
    seconds: float


class Session(Protocol):
    """A loaded artifact."""

    runtime: str
    runtime_version: str
    kind: Literal["decoder", "encoder"]
    context_length: int | None

    def count_tokens(self, text: str) -> int:
        """Tokens the model's own tokenizer makes of a text (special tokens included)."""

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """A chat rendered with the model's own chat template, ready for generation."""

    def generate(self, prompt: str, max_new_tokens: int) -> Generation:
        """Greedy generation."""

    def embed(self, text: str) -> Embedding:
        """Mean-pooled, L2-normalized embedding (encoders)."""

    def close(self) -> None:
        """Free the model."""


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


_RUNNERS = {"hf": "converters.run_hf", "gguf": "converters.run_gguf", "onnx": "converters.run_onnx"}


def open_session(artifact_dir: Path, artifact: Artifact, manifest: Manifest) -> Session:
    """Load an artifact with the runtime its format needs."""
    module = _RUNNERS.get(artifact.format)
    if module is None:
        raise UsageError(f"no runtime for {artifact.format} artifacts in this build",
                         hint=f"check with one of: {', '.join(sorted(_RUNNERS))}")
    session: Session = importlib.import_module(module).open_session(artifact_dir, artifact, manifest)
    return session
