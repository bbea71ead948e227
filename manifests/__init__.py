"""Pydantic schema of everything mreg writes to storage."""

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
    "ConverterInfo",
    "FileEntry",
    "Format",
    "GGUFRequirements",
    "HistoryEntry",
    "Manifest",
    "Provenance",
    "PullRecord",
    "SourceFile",
    "SourceInfo",
    "TensorRTRequirements",
    "Verification",
]
