"""The Python API runs the whole loop without the CLI: typed results, nothing printed, errors raised."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.tiny_models import build_tiny_llama

from registry import api
from registry.errors import GateRefused, UsageError, VersionNotFound
from registry.store.local import LocalStore


def test_the_loop_through_the_api(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cache, root = tmp_path / "c", tmp_path / "s"
    store = api.open_store(root)
    assert isinstance(store, LocalStore)
    first = build_tiny_llama(tmp_path / "v1", seed=1)
    second = build_tiny_llama(tmp_path / "v2", seed=2)
    made = api.convert(str(first), ["hf"], name="m", store=store, cache=cache)
    assert (made.version.number, made.reused) == (1, False)
    assert made.source.kind == "local" and made.version.manifest.artifacts[0].verification.status == "passed"
    assert api.convert(str(first), [("hf", {})], name="m", store=store, cache=cache).reused
    assert api.convert(str(second), ["hf"], name="m", store=store, cache=cache).version.number == 2

    assert api.promote(store, "m@1", expect=None, reason="first").change.to_version == 1
    assert api.promote(store, "m@2", expect=1).change.from_version == 1
    r = api.resolve(store, "m@production")
    assert (r.version, r.alias, r.path) == (2, "production", str(root / "models" / "m" / "production" / "hf"))
    assert api.resolve(store, "m@1", fmt="hf").path == str(root / "models" / "m" / "versions" / "1" / "hf")
    change = api.rollback(store, "m")
    assert (change.from_version, change.to_version) == (2, 1)

    assert [rep.ok for rep in api.verify(store, all_versions=True)] == [True, True]
    plan = api.gc(store, keep_latest=0, keep_history=0)
    assert plan.versions == (("m", 2),) and not plan.leases, "m@2 is unreferenced; nothing removed without apply"
    assert store.versions("m") == [1, 2]
    assert capsys.readouterr() == ("", ""), "the library never prints"


def test_api_errors_carry_exit_codes_and_hints(tmp_path: Path) -> None:
    store = api.open_local_store(tmp_path / "s")
    src = build_tiny_llama(tmp_path / "v1", seed=1)
    with pytest.raises(UsageError, match="--name is required"):
        api.convert(str(src), ["hf"], store=store, cache=tmp_path / "c")
    with pytest.raises(UsageError, match="no converter for format 'nope'") as bad:
        api.check_targets(["nope"])
    assert bad.value.exit_code == 2 and bad.value.hint
    api.convert(str(src), ["hf"], name="m", store=store, cache=tmp_path / "c")
    with pytest.raises(VersionNotFound) as missing:
        api.resolve(store, "m@9")
    assert missing.value.exit_code == 3
    with pytest.raises(GateRefused):
        api.promote(store, "m@1", require=["gguf"])
    with pytest.raises(UsageError, match="local store"):
        api.open_local_store("s3://bucket/prefix")
