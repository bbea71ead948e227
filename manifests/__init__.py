"""Pydantic schema of everything mreg writes to storage."""

from manifests.checks import Baseline, CaseResult, CheckRecord, GoldenCase
from manifests.models import (
    SCHEMA_VERSION,
    AliasRecord,
    Artifact,
    ConverterInfo,
    FileEntry,
    Format,
    GGUFRequirements,
    HistoryEntry,
    Manifest,
    ModelInfo,
    Provenance,
    PullRecord,
    SourceFile,
    SourceInfo,
    TensorRTRequirements,
    Verification,
)

__all__ = [
    "SCHEMA_VERSION",
    "AliasRecord",
    "Artifact",
    "Baseline",
    "CaseResult",
    "CheckRecord",
    "ConverterInfo",
    "FileEntry",
    "Format",
    "GGUFRequirements",
    "GoldenCase",
    "HistoryEntry",
    "Manifest",
    "ModelInfo",
    "Provenance",
    "PullRecord",
    "SourceFile",
    "SourceInfo",
    "TensorRTRequirements",
    "Verification",
]
