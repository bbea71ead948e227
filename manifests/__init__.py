"""Pydantic schema of everything mreg writes to storage."""

from manifests.checks import Baseline, CaseResult, CheckRecord, GoldenCase
from manifests.models import (
    SCHEMA_VERSION,
    AliasRecord,
    Artifact,
    ConverterInfo,
    EngineRecord,
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
from manifests.signatures import SignatureRecord

__all__ = [
    "SCHEMA_VERSION",
    "AliasRecord",
    "Artifact",
    "Baseline",
    "CaseResult",
    "CheckRecord",
    "ConverterInfo",
    "EngineRecord",
    "FileEntry",
    "Format",
    "GGUFRequirements",
    "GoldenCase",
    "HistoryEntry",
    "Manifest",
    "ModelInfo",
    "Provenance",
    "PullRecord",
    "SignatureRecord",
    "SourceFile",
    "SourceInfo",
    "TensorRTRequirements",
    "Verification",
]
