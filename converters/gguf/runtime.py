"""The `gguf` runtime: llama.cpp through llama-cpp-python, greedy, fixed seed, CPU."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from manifests import Artifact, Manifest
from registry.convert.protocol import Embedding, Generation
from registry.errors import UsageError


class GGUFSession:
    """A GGUF file loaded by llama.cpp."""

    runtime = "llama.cpp"
    kind: Literal["decoder", "encoder"] = "decoder"

    def __init__(self, path: Path, manifest: Manifest) -> None:
        try:
            import llama_cpp
        except ImportError as e:
            raise UsageError("running gguf artifacts needs llama-cpp-python", hint="pip install 'mreg[gguf]'") from e
        self.runtime_version = f"llama-cpp-python {llama_cpp.__version__}"
        info = manifest.model
        trained = info.context_length if info and info.context_length else 2048
        self.llm: Any = llama_cpp.Llama(model_path=str(path), n_ctx=min(trained, 4096), seed=0, n_threads=2,
                                        verbose=False)
        self.context_length = int(self.llm.n_ctx())
        self.template: str | None = self.llm.metadata.get("tokenizer.chat_template")

    def count_tokens(self, text: str) -> int:
        """Tokens llama.cpp makes of a text, BOS included when the model adds it."""
        return len(self.llm.tokenize(text.encode(), add_bos=True, special=True))

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """Render with the chat template stored in the GGUF metadata."""
        if not self.template:
            raise UsageError("this GGUF file has no chat template", hint="use `prompt` instead of `messages`")
        import jinja2

        env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
        bos = self.llm.detokenize([self.llm.token_bos()]).decode(errors="replace")
        eos = self.llm.detokenize([self.llm.token_eos()]).decode(errors="replace")
        text: str = env.from_string(self.template).render(messages=messages, add_generation_prompt=True,
                                                           bos_token=bos, eos_token=eos)
        return text

    def generate(self, prompt: str, max_new_tokens: int) -> Generation:
        """Greedy completion."""
        self.llm.reset()
        t0 = time.perf_counter()
        out = self.llm.create_completion(prompt, max_tokens=max_new_tokens, temperature=0.0, top_k=1, seed=0,
                                         repeat_penalty=1.0)
        seconds = time.perf_counter() - t0
        usage = out.get("usage", {})
        return Generation(out["choices"][0]["text"], int(usage.get("prompt_tokens", 0)),
                          int(usage.get("completion_tokens", 0)), seconds)

    def embed(self, text: str) -> Embedding:
        """Not offered for decoder GGUF files."""
        raise UsageError("embedding checks need an encoder model", hint="use prompt/messages cases for GGUF")

    def close(self) -> None:
        """Free the model."""
        self.llm.close()


def open_session(artifact_dir: Path, artifact: Artifact, manifest: Manifest) -> GGUFSession:
    """Load the GGUF file of an artifact."""
    files = [f.path for f in artifact.files if f.path.endswith(".gguf")]
    if not files:
        raise UsageError(f"the {artifact.format} artifact has no .gguf file", hint="re-run the conversion")
    return GGUFSession(artifact_dir / files[0], manifest)
