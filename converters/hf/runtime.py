"""The `hf` runtime: transformers on the CPU (or the first GPU), greedy, fixed seed."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

from converters.hf.quiet import transformers_quiet
from converters.hf.tokenizer import HFTokenizerSession, plain_greedy
from manifests import Artifact, Manifest
from registry.convert.protocol import Embedding, Generation
from registry.errors import UsageError


class HFSession(HFTokenizerSession):
    """A transformers model and its tokenizer."""

    runtime = "transformers"

    def __init__(self, path: Path, manifest: Manifest) -> None:
        try:
            import torch
            import transformers
        except ImportError as e:
            raise UsageError("running hf artifacts needs torch and transformers",
                             hint="pip install 'mreg[onnx]' (or torch==2.13.0 and transformers)") from e
        torch.manual_seed(0)
        self.torch: Any = torch
        self.runtime_version = f"transformers {transformers.__version__}, torch {torch.__version__}"
        with transformers_quiet():  # its "Loading weights" bar and warnings on stderr: not mreg's one line
            self.tokenizer: Any = transformers.AutoTokenizer.from_pretrained(path)
            config = transformers.AutoConfig.from_pretrained(path)
            archs = getattr(config, "architectures", None) or []
            self.kind: Literal["decoder", "encoder"] = (
                "decoder" if any(a.endswith("ForCausalLM") for a in archs) else "encoder")
            auto = transformers.AutoModelForCausalLM if self.kind == "decoder" else transformers.AutoModel
            self.model: Any = auto.from_pretrained(path, dtype=torch.float32).eval()
        info = manifest.model
        self.context_length = info.context_length if info else None

    def generate(self, prompt: str, max_new_tokens: int, templated: bool = False) -> Generation:
        """Greedy generation (a rendered chat gets no special tokens added: it holds them)."""
        enc = self.tokenizer(prompt, return_tensors="pt", add_special_tokens=not templated)
        t0 = time.perf_counter()
        with self.torch.no_grad(), plain_greedy(self.model):
            out = self.model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                      pad_token_id=self.tokenizer.pad_token_id or self.tokenizer.eos_token_id)
        seconds = time.perf_counter() - t0
        new = out[0, enc["input_ids"].shape[1]:]
        text: str = self.tokenizer.decode(new, skip_special_tokens=True)
        return Generation(text, int(enc["input_ids"].shape[1]), int(new.shape[0]), seconds)

    def embed(self, text: str) -> Embedding:
        """Mean-pooled, normalized last hidden state."""
        enc = self.tokenizer(text, return_tensors="pt")
        t0 = time.perf_counter()
        with self.torch.no_grad():
            hidden = self.model(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).float()
        pooled = (hidden * mask).sum(1) / mask.sum(1)
        vec = self.torch.nn.functional.normalize(pooled, dim=-1)[0]
        return Embedding(tuple(float(x) for x in vec), int(enc["input_ids"].shape[1]), time.perf_counter() - t0)

    def close(self) -> None:
        """Drop the model."""
        self.model = None


def open_session(artifact_dir: Path, artifact: Artifact, manifest: Manifest) -> HFSession:
    """Load an hf artifact."""
    return HFSession(artifact_dir, manifest)
