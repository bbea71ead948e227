"""The `gguf` runtime: llama.cpp in a child process (`converters.gguf.worker`), greedy, fixed seed, CPU.

The model lives in the child: a crash of llama.cpp's native code (its repacked kernels crash on
some CPUs) ends that process, and mreg reports it as `RuntimeCrashed` (exit 12) with the signal.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from converters.gguf.llama import crashed
from manifests import Artifact, Manifest
from registry.config import inherited, python_path
from registry.convert.protocol import Embedding, Generation
from registry.errors import UsageError

#: The context mreg check asks for: the model's own, up to this.
MAX_CONTEXT = 4096


class GGUFSession:
    """A GGUF file loaded by llama.cpp in a child process."""

    runtime = "llama.cpp"
    kind: Literal["decoder", "encoder"] = "decoder"

    def __init__(self, path: Path, manifest: Manifest) -> None:
        if importlib.util.find_spec("llama_cpp") is None:
            raise UsageError("running gguf artifacts needs llama-cpp-python", hint="pip install 'mreg[gguf]'")
        info = manifest.model
        trained = info.context_length if info and info.context_length else 2048
        root = Path(__file__).resolve().parents[2]
        env = inherited(PYTHONPATH=python_path(root))
        # The child's stderr, for the last line of a crash; unlinked at once, so nothing is left behind.
        self._log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - open for the session's life, closed in close()
        self._child = subprocess.Popen(
            [sys.executable, "-m", "converters.gguf.worker", str(path), str(min(trained, MAX_CONTEXT))],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env)
        hello = self._ask(None, f"loading {path.name}")
        self.runtime_version = str(hello["runtime_version"])
        self.context_length: int = int(hello["context_length"])
        self.template: str | None = hello.get("template")
        #: The file's named templates (`tokenizer.chat_template.NAME`), e.g. `tool_use`.
        self.templates: dict[str, str] = dict(hello.get("templates") or {})
        self._special_tokens: dict[str, str] = dict(hello.get("special_tokens") or {})

    def _ask(self, request: dict[str, Any] | None, doing: str) -> dict[str, Any]:
        """Send one request (None: read the greeting) and read its answer; a dead child is RuntimeCrashed."""
        assert self._child.stdin is not None and self._child.stdout is not None
        try:
            if request is not None:
                self._child.stdin.write(json.dumps(request) + "\n")
                self._child.stdin.flush()
            line = self._child.stdout.readline()
        except (BrokenPipeError, OSError):
            line = ""
        if line:
            answer: dict[str, Any] = json.loads(line)
            return answer
        code = self._child.wait()
        self._log.seek(0)
        lines = [ln for ln in self._log.read().splitlines() if ln.strip()]
        self._log.close()
        raise crashed(doing, code, lines[-1][:300] if lines else "")

    def count_tokens(self, text: str, templated: bool = False) -> int:
        """Tokens llama.cpp makes of a text, BOS included when the model adds it (not to a rendered chat)."""
        return int(self._ask({"op": "tokens", "text": text, "templated": templated}, "tokenizing")["count"])

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        """Render with the chat template stored in the GGUF metadata, as transformers renders it.

        The template and the special tokens come from the file; with tools, a `tool_use` template
        the file also carries is chosen, as transformers chooses it from the source's templates.
        """
        from registry.convert import chat

        template = self.templates.get("tool_use") if tools is not None else None
        template = template or self.template
        if not template:
            raise UsageError("this GGUF file has no chat template", hint="use `prompt` instead of `messages`")
        return chat.render(template, messages, tools=tools, add_generation_prompt=True,
                           special_tokens=self._special_tokens)

    def generate(self, prompt: str, max_new_tokens: int, templated: bool = False) -> Generation:
        """Greedy completion (a rendered chat is tokenized as it is: no BOS added, its special tokens parsed)."""
        out = self._ask({"op": "generate", "prompt": prompt, "max_new_tokens": max_new_tokens,
                         "templated": templated}, "generating")
        return Generation(str(out["text"]), int(out["prompt_tokens"]), int(out["output_tokens"]),
                          float(out["seconds"]))

    def embed(self, text: str) -> Embedding:
        """Not offered for decoder GGUF files."""
        raise UsageError("embedding checks need an encoder model", hint="use prompt/messages cases for GGUF")

    def close(self) -> None:
        """End the child (it frees the model)."""
        if self._child.poll() is None:
            try:
                assert self._child.stdin is not None
                self._child.stdin.write(json.dumps({"op": "close"}) + "\n")
                self._child.stdin.close()
                self._child.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._child.kill()
                self._child.wait()
        if not self._log.closed:
            self._log.close()


def open_session(artifact_dir: Path, artifact: Artifact, manifest: Manifest) -> GGUFSession:
    """Load the GGUF file of an artifact."""
    files = [f.path for f in artifact.files if f.path.endswith(".gguf")]
    if not files:
        raise UsageError(f"the {artifact.format} artifact has no .gguf file", hint="re-run the conversion")
    return GGUFSession(artifact_dir / files[0], manifest)
