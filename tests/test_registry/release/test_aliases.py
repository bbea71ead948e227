"""Promotion and rollback: atomic flips, history, --expect, gates, walking back."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from manifests import Verification
from registry import layout
from registry.release import aliases
from registry.store.local import LocalStore


@pytest.fixture
def three_versions(mreg: Any, model_dir: Path) -> str:
    """Model `m` with versions 1, 2, 3."""
    for i in range(3):
        (model_dir / "config.json").write_text(f'{{"i": {i}}}')
        assert mreg("convert", model_dir, "--to", "hf", "--name", "m").exit_code == 0
    return "m"


def test_promote_and_rollback_walk_back(mreg: Any, three_versions: str, store_root: Path) -> None:
    link = store_root / "models" / "m" / "production"
    for v in (1, 2, 3):
        doc = mreg("promote", f"m@{v}", "-m", f"release {v}", "--json").json
        assert doc["to"] == v and doc["changed"] is True and doc["schema_version"] == 1
        assert os.readlink(link) == f"versions/{v}", "alias is a relative symlink"
    assert mreg("rollback", "m", "--json").json == {
        "schema_version": 1, "name": "m", "alias": "production", "from": 3, "to": 2, "changed": True,
        "action": "rollback"}
    assert mreg("rollback", "m", "--json").json["to"] == 1
    r = mreg("rollback", "m")
    assert r.exit_code == 3 and "no earlier version" in r.stderr and "--to" in r.stderr
    assert mreg("rollback", "m", "--to", "3", "--json").json["to"] == 3
    hist = mreg("history", "m", "--json").json["entries"]
    assert [(e["action"], e["from"], e["to"]) for e in hist] == [
        ("promote", None, 1), ("promote", 1, 2), ("promote", 2, 3),
        ("rollback", 3, 2), ("rollback", 2, 1), ("rollback", 1, 3)]
    assert hist[0]["reason"] == "release 1" and hist[0]["by"]["host"]
    assert (store_root / "models/m/production/hf/config.json").read_text() == '{"i": 2}'


def test_promote_to_current_is_a_noop(mreg: Any, three_versions: str) -> None:
    mreg("promote", "m@2")
    doc = mreg("promote", "m@2", "--json").json
    assert doc["changed"] is False
    assert len(mreg("history", "m", "--json").json["entries"]) == 1
    assert "already at 2" in mreg("promote", "m@2").stdout


def test_expect_mismatch_changes_nothing(mreg: Any, three_versions: str, store_root: Path) -> None:
    mreg("promote", "m@1")
    r = mreg("promote", "m@3", "--expect", "2", "--json")
    assert r.exit_code == 5
    assert r.json["error"]["type"] == "Conflict" and "is 1, not 2" in r.json["error"]["message"]
    assert os.readlink(store_root / "models/m/production") == "versions/1"
    assert len(mreg("history", "m", "--json").json["entries"]) == 1
    assert mreg("promote", "m@3", "--expect", "1").exit_code == 0
    assert mreg("promote", "m@1", "--alias", "staging", "--expect", "none").exit_code == 0
    assert mreg("promote", "m@2", "--alias", "staging", "--expect", "none").exit_code == 5


def test_aliases_are_independent(mreg: Any, three_versions: str) -> None:
    mreg("promote", "m@1")
    mreg("promote", "m@2", "--alias", "staging")
    mreg("promote", "m@3", "--alias", "staging")
    assert mreg("rollback", "m", "--alias", "staging", "--json").json["to"] == 2
    assert mreg("show", "m@production", "--json").json["version"] == 1
    listing = mreg("list", "--json").json["models"]
    assert listing == [{"name": "m", "versions": 3, "aliases": {"production": 1, "staging": 2}}]


def test_promote_unknown_version_or_bad_alias(mreg: Any, three_versions: str) -> None:
    r = mreg("promote", "m@9")
    assert r.exit_code == 3 and "m@9 does not exist" in r.stderr
    for bad in ("versions", "latest", "Prod", "../x"):
        assert mreg("promote", "m@1", "--alias", bad).exit_code == 2


def test_names_mreg_keeps_beside_versions_are_not_aliases(mreg: Any, three_versions: str, store_root: Path) -> None:
    """`checks/` and `baselines/` hold golden-check records: an alias there would send them into a version."""
    for reserved in sorted(layout.RESERVED_ALIASES):
        r = mreg("promote", "m@1", "--alias", reserved, "--json")
        assert r.exit_code == 2 and r.json["error"]["type"] == "UsageError", reserved
        assert not (store_root / "models" / "m" / reserved).is_symlink()
    assert {"checks", "baselines", "versions"} <= layout.RESERVED_ALIASES


def test_gates(mreg: Any, three_versions: str, store_root: Path) -> None:
    r = mreg("promote", "m@1", "--require", "tensorrt", "--json")
    assert r.exit_code == 6 and "no tensorrt artifact" in r.json["error"]["message"]
    assert mreg("promote", "m@1", "--require", "hf").exit_code == 0
    store = LocalStore(store_root)
    v = store.version("m", 2)
    failed = v.manifest.artifacts[0].model_copy(update={"verification": Verification(
        status="failed", method="test", reference="x")})
    bad = v.manifest.model_copy(update={"artifacts": (failed,)})
    with pytest.raises(aliases.GateRefused, match="failed verification"):
        aliases.promote(store, "m", v.__class__(v.name, v.number, bad, v.manifest_sha256, v.path))
    assert store.alias("m", "production") == 1
    change = aliases.promote(store, "m", v.__class__(v.name, v.number, bad, v.manifest_sha256, v.path), force=True)
    assert change.to_version == 2


def test_failed_flip_leaves_alias_and_history_untouched(three_versions: str, store_root: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalStore(store_root)
    aliases.promote(store, "m", store.version("m", 1))
    real = os.replace

    def boom(src: Any, dst: Any) -> None:
        if str(dst).endswith("production"):
            raise OSError(errno.EIO, "simulated")
        real(src, dst)

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="simulated"):
        aliases.promote(store, "m", store.version("m", 2))
    monkeypatch.setattr(os, "replace", real)
    assert store.alias("m", "production") == 1
    assert len(store.history("m")) == 1
    assert not [p for p in layout.model_dir(store_root, "m").iterdir() if "alias" in p.name], "no temp symlink left"


def test_flip_without_history_is_repaired(three_versions: str, store_root: Path) -> None:
    store = LocalStore(store_root)
    aliases.promote(store, "m", store.version("m", 1))
    store.set_alias("m", "production", 2)  # a writer killed between the flip and the history append
    aliases.promote(store, "m", store.version("m", 3))
    assert [(e.action, e.from_version, e.to_version) for e in store.history("m")] == [
        ("promote", None, 1), ("repair", 1, 2), ("promote", 2, 3)]
    assert aliases.rollback(store, "m").to_version == 2


def test_torn_history_line_is_ignored(three_versions: str, store_root: Path) -> None:
    store = LocalStore(store_root)
    aliases.promote(store, "m", store.version("m", 1))
    with open(layout.model_dir(store_root, "m") / "history.jsonl", "a") as f:
        f.write('{"schema_version": 1, "alias": "produ')
    assert len(store.history("m")) == 1
    aliases.promote(store, "m", store.version("m", 2))
    assert [e.to_version for e in store.history("m")][-1] == 2


def test_rollback_stack() -> None:
    from manifests import HistoryEntry
    from registry import provenance

    def e(action: str, to: int) -> HistoryEntry:
        return HistoryEntry.model_validate({"alias": "p", "action": action, "from": None, "to": to,
                                            "by": provenance.now()})

    h = [e("promote", 1), e("promote", 2), e("promote", 3), e("rollback", 2), e("promote", 4)]
    assert aliases.rollback_stack(h, "p") == [1, 2, 4]
    assert aliases.rollback_stack(h, "other") == []
