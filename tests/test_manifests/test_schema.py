"""The JSON Schema in the repo matches the models; records refuse unknown fields and unsafe paths."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from manifests import FileEntry, HistoryEntry, Manifest
from manifests.export import expected_files, main


def test_exported_schema_matches_models() -> None:
    for path, text in expected_files().items():
        assert path.exists(), f"{path} missing: run `python -m manifests.export`"
        assert path.read_text() == text, f"{path} drifted from the models: run `python -m manifests.export`"
    assert main(["--check"]) == 0


def test_schema_forbids_extra_fields() -> None:
    schema = json.loads(next(t for p, t in expected_files().items() if p.name == "manifest.schema.json"))
    assert schema["additionalProperties"] is False
    with pytest.raises(ValidationError):
        FileEntry.model_validate({"path": "a", "size": 1, "sha256": "0" * 64, "colour": "red"})


@pytest.mark.parametrize("bad", ["../x", "/etc/passwd", "a/../b", "a//b", "./a", "a\\b", ""])
def test_file_entries_refuse_unsafe_paths(bad: str) -> None:
    with pytest.raises(ValidationError):
        FileEntry(path=bad, size=1, sha256="0" * 64)


def test_records_are_frozen() -> None:
    e = FileEntry(path="a", size=1, sha256="0" * 64)
    with pytest.raises(ValidationError):
        e.size = 2  # type: ignore[misc]


def test_history_entry_uses_from_and_to_on_disk() -> None:
    e = HistoryEntry.model_validate({
        "alias": "production", "action": "promote", "from": None, "to": 3,
        "by": {"user": "u", "host": "h", "at": "2026-01-01T00:00:00Z", "mreg_version": "0", "python": "3"},
    })
    doc = json.loads(e.model_dump_json(by_alias=True))
    assert doc["from"] is None and doc["to"] == 3
    assert Manifest.model_fields["schema_version"].default == 1


def test_written_records_validate_against_the_exported_schema(mreg: Any, model_dir: Path, store_root: Path) -> None:
    import jsonschema

    from manifests.export import SCHEMA_DIR

    assert mreg("convert", model_dir, "--to", "hf", "--name", "m").exit_code == 0
    assert mreg("promote", "m@1").exit_code == 0
    schema = json.loads((SCHEMA_DIR / "manifest.schema.json").read_text())
    manifest = json.loads((store_root / "models/m/versions/1/manifest.json").read_text())
    jsonschema.validate(manifest, schema)
    entry_schema = json.loads((SCHEMA_DIR / "history_entry.schema.json").read_text())
    for line in (store_root / "models/m/history.jsonl").read_text().splitlines():
        jsonschema.validate(json.loads(line), entry_schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**manifest, "unexpected": 1}, schema)


#: A GGUF verification as mreg wrote it before `structural` and `not_run` existed, of a file llama.cpp never loaded.
_OLD_UNLOADED = {"status": "passed", "method": "gguf reader: …; llama.cpp (…): load, tokenization against the HF "
                 "tokenizer, logits against mreg's streaming float32 forward pass", "reference": "r@c",
                 "detail": "llama.cpp runtime not installed (pip install 'mreg[gguf]'): not loaded"}


@pytest.mark.parametrize(("doc", "loaded", "unrun"), [
    (_OLD_UNLOADED, False, "not loaded by llama.cpp"),  # old manifests still read, and are not taken at their word
    ({**_OLD_UNLOADED, "detail": None}, True, ""),
    ({"status": "structural", "method": "gguf reader", "reference": "r@c", "not_run": ["not loaded by llama.cpp: x"]},
     False, "not loaded by llama.cpp: x"),
    ({"status": "unverified", "method": "m", "reference": "r@c"}, False, ""),
    ({"status": "failed", "method": "m", "reference": "r@c"}, True, ""),
])
def test_verification_says_whether_its_runtime_ran(doc: dict[str, Any], loaded: bool, unrun: str) -> None:
    from manifests import Verification

    v = Verification.model_validate(doc)
    assert v.loaded() is loaded and "; ".join(v.unrun()).startswith(unrun) and bool(v.unrun()) == bool(unrun)
