"""The `onnx` runtime: ONNX Runtime on the CPU, greedy, with the tokenizer shipped beside the model."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from converters.hf.tokenizer import HFTokenizerSession
from manifests import Artifact, Manifest
from registry.convert.protocol import Embedding, Generation
from registry.errors import UsageError


class OnnxSession(HFTokenizerSession):
    """An exported model in ONNX Runtime; decoders generate by re-running the prefix (or with their KV cache)."""

    runtime = "onnxruntime"

    def __init__(self, path: Path, artifact: Artifact, manifest: Manifest) -> None:
        try:
            import numpy as np
            import onnxruntime as ort
            import transformers
        except ImportError as e:
            raise UsageError("running onnx artifacts needs onnxruntime and transformers",
                             hint="pip install 'mreg[onnx]'") from e
        self.np: Any = np
        self.runtime_version = f"onnxruntime {ort.__version__}"
        model = next((f.path for f in artifact.files if f.path.endswith(".onnx")), None)
        if model is None:
            raise UsageError("the onnx artifact has no .onnx file", hint="re-run the conversion")
        self.session: Any = ort.InferenceSession(str(path / model), providers=["CPUExecutionProvider"])
        self.tokenizer: Any = transformers.AutoTokenizer.from_pretrained(path)
        self.inputs = {i.name: i for i in self.session.get_inputs()}
        names = [o.name for o in self.session.get_outputs()]
        self.kind: Literal["decoder", "encoder"] = "decoder" if "logits" in names else "encoder"
        self.with_past = any(n.startswith("past_key_values") for n in self.inputs)
        info = manifest.model
        self.context_length = info.context_length if info else None

    def _feeds(self, ids: list[int]) -> dict[str, Any]:
        np = self.np
        n = len(ids)
        feeds: dict[str, Any] = {"input_ids": np.array([ids], dtype=np.int64)}
        if "attention_mask" in self.inputs:
            feeds["attention_mask"] = np.ones((1, n), dtype=np.int64)
        if "position_ids" in self.inputs:
            feeds["position_ids"] = np.arange(n, dtype=np.int64)[None, :]
        if "token_type_ids" in self.inputs:
            feeds["token_type_ids"] = np.zeros((1, n), dtype=np.int64)
        for name, meta in self.inputs.items():
            if name.startswith("past_key_values"):  # an empty cache: the whole prefix is run each step
                shape = [1 if i == 0 else (0 if i == 2 else d) for i, d in enumerate(meta.shape)]
                dtype = np.float16 if "float16" in meta.type else np.float32
                feeds[name] = np.zeros(shape, dtype=dtype)
        return feeds

    def generate(self, prompt: str, max_new_tokens: int, templated: bool = False) -> Generation:
        """Greedy generation (the prefix is re-run at each step: simple, and exact; a rendered chat gets no
        special tokens added)."""
        ids = list(self.tokenizer(prompt, add_special_tokens=not templated)["input_ids"])
        n_prompt = len(ids)
        eos = self.tokenizer.eos_token_id
        t0 = time.perf_counter()
        for _ in range(max_new_tokens):
            logits = self.session.run(["logits"], self._feeds(ids))[0]
            nxt = int(logits[0, -1].argmax())
            ids.append(nxt)
            if nxt == eos:
                break
        seconds = time.perf_counter() - t0
        text: str = self.tokenizer.decode(ids[n_prompt:], skip_special_tokens=True)
        return Generation(text, n_prompt, len(ids) - n_prompt, seconds)

    def embed(self, text: str) -> Embedding:
        """Mean-pooled, normalized last hidden state."""
        np = self.np
        ids = list(self.tokenizer(text)["input_ids"])
        t0 = time.perf_counter()
        hidden = self.session.run(None, self._feeds(ids))[0][0]
        pooled = hidden.mean(axis=0)
        vec = pooled / (np.linalg.norm(pooled) or 1.0)
        return Embedding(tuple(float(x) for x in vec), len(ids), time.perf_counter() - t0)

    def close(self) -> None:
        """Drop the session."""
        self.session = None


def open_session(artifact_dir: Path, artifact: Artifact, manifest: Manifest) -> OnnxSession:
    """Load an onnx artifact."""
    return OnnxSession(artifact_dir, artifact, manifest)
