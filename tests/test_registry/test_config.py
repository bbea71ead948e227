"""The cache and store roots are explicit: flag, then environment, then config file; never a silent default."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest


def test_no_cache_configured_is_a_usage_error(mreg: Any, model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MREG_CACHE_DIR")
    r = mreg("pull", model_dir)
    assert r.exit_code == 2
    assert "no cache directory chosen" in r.stderr
    assert "--cache-dir" in r.stderr and "MREG_CACHE_DIR" in r.stderr


def test_no_store_configured_is_a_usage_error(mreg: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MREG_STORE")
    r = mreg("list", "--json")
    assert r.exit_code == 2
    assert r.json["error"]["type"] == "UsageError"
    assert "MREG_STORE" in r.json["error"]["hint"]


def test_precedence_flag_env_config(mreg: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "home" / ".config" / "mreg" / "config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(f'cache_dir = "{tmp_path / "from-config"}"\nstore = "{tmp_path / "store-config"}"\n')
    monkeypatch.delenv("MREG_CACHE_DIR")
    doc = mreg("config", "--json").json
    assert doc["cache_dir"] == {"value": str(tmp_path / "from-config"), "origin": f"config {cfg}"}
    assert doc["store"]["origin"] == "env MREG_STORE"
    doc = mreg("config", "--json", "--cache-dir", str(tmp_path / "flag")).json
    assert doc["cache_dir"] == {"value": str(tmp_path / "flag"), "origin": "flag"}
    monkeypatch.setenv("MREG_CACHE_DIR", str(tmp_path / "env"))
    assert mreg("config", "--json").json["cache_dir"]["origin"] == "env MREG_CACHE_DIR"


def test_pull_uses_config_file_cache(mreg: Any, model_dir: Path, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MREG_CACHE_DIR")
    cfg = tmp_path / "mreg.toml"
    cfg.write_text(f'cache_dir = "{tmp_path / "cfg-cache"}"\n')
    r = mreg("pull", model_dir, "--config", cfg, "--json")
    assert r.exit_code == 0, r.stderr
    assert r.json["cache_dir"] == str(tmp_path / "cfg-cache")
    assert (tmp_path / "cfg-cache").is_dir()


def test_bad_config_file(mreg: Any, tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text("cache_dir = [unclosed\n")
    r = mreg("config", "--config", cfg)
    assert r.exit_code == 2 and "not valid TOML" in r.stderr
    r = mreg("config", "--config", tmp_path / "missing.toml")
    assert r.exit_code == 2 and "does not exist" in r.stderr


@pytest.mark.parametrize(("table", "message"), [
    ({"require": "check:smoke"}, "require must be a list of strings"),
    ({"require": 5}, "require must be a list of strings"),
    ({"require": {"a": 1}}, "require must be a list of strings"),
    ({"ready_timeout": "soon"}, "ready_timeout must be a number of seconds"),
    ({"reloads": "x"}, "unknown keys in [models.m]: reloads"),
])
def test_a_bad_models_table_is_a_usage_error(table: dict[str, object], message: str) -> None:
    from registry.errors import UsageError
    from registry.release.hooks import model_policy

    with pytest.raises(UsageError, match=re.escape(message)) as caught:
        model_policy({"models": {"m": table}}, "m")
    assert caught.value.hint


def test_config_env_lists_every_variable_with_its_value_and_origin(mreg: Any, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from registry.config import VARIABLES

    cfg = tmp_path / "mreg.toml"
    cfg.write_text(f'cache_dir = "{tmp_path / "from-config"}"\n')
    monkeypatch.delenv("MREG_CACHE_DIR")
    monkeypatch.setenv("MREG_USER", "ci-deploy")
    monkeypatch.delenv("MREG_STALL_BYTES", raising=False)
    monkeypatch.delenv("MREG_GGUF_DIRECT_IO", raising=False)
    plain = mreg("config", "--config", cfg, "--json").json
    assert "environment" not in plain, "without --env the document is what it always was"
    doc = mreg("config", "--config", cfg, "--env", "--json").json
    assert {k: v for k, v in doc.items() if k != "environment"} == plain
    rows = {row["name"]: row for row in doc["environment"]}
    assert list(rows) == [v.name for v in VARIABLES]
    assert rows["MREG_USER"]["value"] == "ci-deploy" and rows["MREG_USER"]["origin"] == "env MREG_USER"
    assert rows["MREG_CACHE_DIR"] == {**rows["MREG_CACHE_DIR"], "value": str(tmp_path / "from-config"),
                                      "origin": f"config {cfg}"}
    assert rows["MREG_STALL_BYTES"]["value"] == "1048576" and rows["MREG_STALL_BYTES"]["origin"] == "default"
    assert rows["MREG_GGUF_DIRECT_IO"]["value"] is None and rows["MREG_GGUF_DIRECT_IO"]["origin"] == "unset"
    assert all(row["meaning"] for row in rows.values())
    text = mreg("config", "--env").stdout
    assert all(v.name in text for v in VARIABLES) and "ci-deploy" in text and "env MREG_USER" in text



@pytest.mark.parametrize("raw", [{"models": {"m": 5}}, {"models": ["m"]}, {"models": {"m": "x"}, "trust": {}}])
def test_the_models_table_has_one_reader(raw: dict[str, object], tmp_path: Path) -> None:
    """Hooks, the trust policy and the rollout read [models.NAME] through config.model_table: one shape check,
    one message, whichever command reads it first (`verify --signatures` no longer skips a broken table)."""
    from registry.config import model_table
    from registry.errors import UsageError
    from registry.release.hooks import model_policy
    from registry.release.rollout import configured
    from registry.store.trust import policy_for

    readers = [lambda: model_table(raw, "m"), lambda: model_policy(raw, "m"), lambda: configured(raw, "m"),
               lambda: policy_for(raw, "m", tmp_path)]
    for read in readers:
        with pytest.raises(UsageError, match=re.escape("[models.m] in the config file is not a table")):
            read()
    assert model_table({}, "m") == {} and model_table({"models": {"m": {"require": ["hf"]}}}, "m") == {
        "require": ["hf"]}
