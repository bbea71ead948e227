"""`registry.Registry`: the loop, the listings and the checks the commands run, on one object; and the host process
(its logging, its stdout) left as it was."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
from support.tiny_models import build_tiny_llama

import registry
from registry import Registry, client
from registry.errors import ModelNotFound, UsageError


def test_the_loop_listings_and_checks_on_one_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    handlers, level, stdout = list(root.handlers), root.level, sys.stdout
    reg = Registry(tmp_path / "s", tmp_path / "c")
    made = reg.convert(str(build_tiny_llama(tmp_path / "v1", seed=1)), ["hf"], name="m")
    assert isinstance(made, client.ConversionOutcome) and made.version.number == 1
    reg.convert(str(build_tiny_llama(tmp_path / "v2", seed=2)), ["hf"], name="m")
    assert reg.promote("m@1", expect=None, reason="first").change.to_version == 1
    assert reg.promote("m@2", expect=1).change.from_version == 1
    assert reg.resolve("m@production").path == str(tmp_path / "s" / "models" / "m" / "production" / "hf")

    listing = reg.list_models()
    assert listing.models == (client.ModelSummary("m", (1, 2), {"production": 2}),) and listing.problems == ()
    versions = reg.list_versions("m")
    assert [v.number for v in versions.versions] == [1, 2] and versions.aliases == {"production": 2}
    shown = reg.show("m@production")
    assert (shown.version.number, shown.aliases, shown.signatures) == (2, ("production",), [])
    assert reg.mount_check("m").ok and reg.mount_check("m", verify=True).paths["hf"].endswith("production/hf")
    assert reg.rollback("m").to_version == 1
    assert [(e.action, e.to_version) for e in reg.history("m", alias="production")] == \
        [("promote", 1), ("promote", 2), ("rollback", 1)]
    assert [r.ok for r in reg.verify(all_versions=True)] == [True, True]
    pushed = reg.push("m@2", f"oci-layout:{tmp_path / 'layout'}:v2")  # any remote, one shape (a layout: no server)
    assert isinstance(pushed, client.PushOutcome) and pushed.tag == "v2" and pushed.digest.startswith("sha256:")
    node = Registry(tmp_path / "node")
    synced = node.sync(f"oci-layout:{tmp_path / 'layout'}:v2")
    assert isinstance(synced, client.SyncOutcome) and (synced.name, synced.version) == ("m", 2)
    assert node.resolve("m@production").path == str(tmp_path / "node" / "models" / "m" / "production" / "hf")

    assert capsys.readouterr() == ("", ""), "the library never prints"
    assert root.handlers == handlers and root.level == level and sys.stdout is stdout, "nor configures the process"


def test_refusals_name_what_is_missing(tmp_path: Path) -> None:
    reg = Registry(tmp_path / "s")
    with pytest.raises(UsageError, match="no cache"):
        reg.pull("org/name")
    with pytest.raises(ModelNotFound):
        reg.history("nope")
    remote = Registry("s3://bucket/prefix", endpoint_url="http://127.0.0.1:9")  # nothing is contacted to open it
    with pytest.raises(UsageError, match="mount_check works on a local store"):
        remote.mount_check("m")


def test_every_name_in_all_is_importable_and_the_package_offers_the_registry() -> None:
    assert all(hasattr(client, name) for name in client.__all__)
    assert registry.Registry is Registry
