"""gc removes a removed version's signature records with it, and never a kept version's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok
from support.pki import write_key

pytest.importorskip("model_signing", reason="signing needs model-signing: pip install 'mreg[sign]'")


def test_gc_removes_the_records_of_the_versions_it_removes(mreg: Any, model_dir: Path, store_root: Path,
                                                           tmp_path: Path) -> None:
    release, _ = write_key(tmp_path / "pki", "release")
    for i in range(4):
        (model_dir / "config.json").write_text(json.dumps({"i": i}))
        ok(mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json"))
    for n in (1, 2, 4):
        ok(mreg("sign", f"m@{n}", "--key", release.private, "--json"))
    ok(mreg("promote", "m@2", "--json"))
    records = store_root / "models/m/signatures"
    # What a gc killed after removing m@3's manifest leaves (records of a version that is gone): a copy of m@1's.
    shutil.copytree(records / "1", records / "3")
    (store_root / "models/m/versions/3/manifest.json").unlink()

    args = ("gc", "--keep-latest", "1", "--keep-history", "0")
    plan = ok(mreg(*args, "--json"))
    assert [v["version"] for v in plan["versions"]] == [1] and [v["version"] for v in plan["signatures"]] == [1, 3]
    assert (records / "1").is_dir(), "a plan removes nothing"
    done = ok(mreg(*args, "--yes", "--json"))
    assert done["applied"] and [v["version"] for v in done["signatures"]] == [1, 3]
    assert sorted(p.name for p in records.iterdir()) == ["2", "4"], "the kept versions' records stay"
    assert (store_root / "models/m/versions/1/.deleted").exists()
    assert len(ok(mreg("show", "m@2", "--json"))["signatures"]) == 1
    assert ok(mreg(*args, "--yes", "--json"))["signatures"] == [], "nothing left to remove"
    assert "signature records" not in mreg(*args).stdout
