"""Export the JSON Schema of every stored record into `manifests/schema/` (run after changing a model)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pydantic import BaseModel

from manifests.checks import Baseline, CheckRecord, GoldenCase
from manifests.models import AliasRecord, EngineRecord, HistoryEntry, Manifest, PullRecord, RolloutRecord
from manifests.signatures import SignatureRecord

SCHEMA_DIR = Path(__file__).parent / "schema"
RECORDS: dict[str, type[BaseModel]] = {
    "manifest": Manifest,
    "history_entry": HistoryEntry,
    "alias_record": AliasRecord,
    "pull_record": PullRecord,
    "check_record": CheckRecord,
    "baseline": Baseline,
    "golden_case": GoldenCase,
    "engine_record": EngineRecord,
    "signature_record": SignatureRecord,
    "rollout_record": RolloutRecord,
}


def render(model: type[BaseModel]) -> str:
    """The schema file's exact text for one record type."""
    schema = model.model_json_schema(by_alias=True, mode="serialization")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def expected_files() -> dict[Path, str]:
    """Every schema file and the text it must hold."""
    return {SCHEMA_DIR / f"{name}.schema.json": render(model) for name, model in RECORDS.items()}


def main(argv: list[str]) -> int:
    """Write the schema files (`--check`: only report drift, exit 1 if any)."""
    drift = [p for p, text in expected_files().items() if not p.exists() or p.read_text() != text]
    if "--check" in argv:
        for p in drift:
            sys.stderr.write(f"{p} is out of date: run `python -m manifests.export`\n")
        return 1 if drift else 0
    SCHEMA_DIR.mkdir(exist_ok=True)
    for p, text in expected_files().items():
        p.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
