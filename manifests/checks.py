"""Golden-set checks: the cases a team writes, and the append-only records mreg keeps of each run."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from manifests.models import SCHEMA_VERSION, Provenance, Sha256


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChatMessage(BaseModel):
    """One message of a chat input, passed to the chat template as written.

    Open, unlike the records: a message may carry what the model's template reads and transformers
    passes through (`tool_calls`, `tool_call_id`, `name`, `reasoning_content`, content parts), and
    the template, not mreg, is the judge of roles and fields (it raises when it refuses them).
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    role: str = Field(min_length=1)
    #: Text, content parts (`[{"type": "text", "text": ...}]`), or absent/null (an assistant's tool call).
    content: str | list[dict[str, Any]] | None = None

    def template_input(self) -> dict[str, Any]:
        """The message as the template sees it: the keys written, extras included, in the file's JSON types."""
        return self.model_dump(mode="json", exclude_unset=True)


class Expectations(_Strict):
    """What a case's output must satisfy."""

    contains: tuple[str, ...] = ()
    not_contains: tuple[str, ...] = ()
    regex: str | None = None
    json_: bool | dict[str, Any] | None = Field(default=None, alias="json")
    max_latency_ms: float | None = None
    min_tokens_per_s: float | None = None
    min_cosine: float | None = None
    baseline: bool = True

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class GoldenCase(_Strict):
    """One line of a golden file: an input and its expectations."""

    id: str = Field(min_length=1, max_length=200)
    prompt: str | None = None
    messages: tuple[ChatMessage, ...] | None = Field(default=None, min_length=1)
    #: Tools offered to the chat template with `messages`: JSON-schema function specs, as transformers takes them
    #: (`{"type": "function", "function": {"name", "description", "parameters"}}`).
    tools: tuple[dict[str, Any], ...] | None = None
    text: str | None = None
    max_new_tokens: int = Field(default=32, ge=1, le=4096)
    expect: Expectations = Field(default_factory=Expectations)

    @model_validator(mode="after")
    def _one_input(self) -> GoldenCase:
        given = [k for k in ("prompt", "messages", "text") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of prompt, messages, text (got {', '.join(given) or 'none'})")
        if self.tools is not None and self.messages is None:
            raise ValueError("tools go with messages (the chat template renders them)")
        return self


class CaseResult(_Strict):
    """What one case produced and how it was judged."""

    id: str
    passed: bool
    output: str | None = None
    embedding_sha256: str | None = None
    prompt_tokens: int
    output_tokens: int = 0
    latency_ms: float
    tokens_per_s: float | None = None
    keyword_hits: int = 0
    keyword_total: int = 0
    cosine: float | None = None
    failures: tuple[str, ...] = ()


class CheckRecord(_Strict):
    """One run of a golden set against one version; kept beside the version, never rewritten."""

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str
    version: int
    manifest_sha256: Sha256
    golden: str
    golden_sha256: Sha256
    format: str
    runtime: str
    runtime_version: str
    hardware: str
    passed: bool
    keyword_hit_rate: float | None = None
    min_keyword_hit_rate: float
    latency_p50_ms: float
    latency_p95_ms: float
    tokens_per_s: float | None = None
    baseline_from: int | None = None
    cases: tuple[CaseResult, ...]
    at: dt.datetime
    by: Provenance


class Baseline(_Strict):
    """Outputs recorded from one version, expected of the next ones (`mreg check --record-baseline`)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str
    golden: str
    golden_sha256: Sha256
    version: int
    format: str
    outputs: dict[str, str] = Field(default_factory=dict)
    embeddings: dict[str, tuple[float, ...]] = Field(default_factory=dict)
    by: Provenance
