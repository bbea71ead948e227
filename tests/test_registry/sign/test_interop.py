"""Interoperability with the model_signing CLI (OpenSSF model-signing), both ways, on the version directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.cli import ok
from support.pki import write_key

from registry import api


def model_signing(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """Run the model_signing command of the installed package."""
    return subprocess.run([sys.executable, "-m", "model_signing", *map(str, args)], capture_output=True, text=True,
                          timeout=120, check=False)


@pytest.mark.slow
def test_mreg_signature_verifies_with_model_signing_and_back(mreg: Any, model_dir: Path, tmp_path: Path,
                                                             store_root: Path, isolated: Path) -> None:
    ok(mreg("convert", model_dir, "--to", "hf", "--name", "m", "--json"))
    vdir = Path(ok(mreg("resolve", "m@1", "--physical", "--json"))["version_path"])
    assert vdir == store_root / "models/m/versions/1/hf"
    vdir = vdir.parent  # the version directory: the manifest and every artifact
    keys, _ = write_key(tmp_path / "pki", "release")

    # mreg → model_signing: the bundle kept in the record is what `model_signing verify key` reads.
    ok(mreg("sign", "m@1", "--key", keys.private, "--json"))
    [rec] = (store_root / "models/m/signatures/1").glob("*.json")
    sig = tmp_path / "mreg.sig"
    sig.write_text(json.dumps(json.loads(rec.read_text())["bundle"]))
    r = model_signing("verify", "key", "--signature", sig, "--public_key", keys.public, vdir)
    assert r.returncode == 0, r.stdout + r.stderr

    # ...and it notices a changed file, as mreg does.
    f = vdir / "hf" / "config.json"
    saved = f.read_bytes()
    f.chmod(0o644)
    f.write_bytes(b"{}")
    assert model_signing("verify", "key", "--signature", sig, "--public_key", keys.public, vdir).returncode != 0
    f.write_bytes(saved)

    # model_signing → mreg: a bundle its CLI made on the version directory is kept and judged like mreg's own.
    other, _ = write_key(tmp_path / "pki", "ops")
    made = tmp_path / "cli.sig"
    r = model_signing("sign", "key", "--signature", made, "--private_key", other.private, vdir)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = ok(mreg("sign", "m@1", "--import", made, "--signer", "ops", "--json"))
    assert doc["method"] == "key" and doc["origin"] == "import"
    cfg = isolated / "home/.config/mreg/config.toml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(f'[trust]\nkeys = ["{other.public}"]\n')
    sigs = ok(mreg("verify", "m@1", "--signatures", "--json"))["versions"][0]["signatures"]
    assert sorted((s["signer"], s["status"]) for s in sigs)[0] == ("ops", "valid")
    assert len(api.open_local_store(store_root).signatures("m", 1)) == 2

    # A bundle of another directory is refused before it is kept.
    ok(mreg("convert", model_dir, "--to", "hf", "--name", "n", "--json"))
    r = mreg("sign", "n@1", "--import", made, "--json")
    assert r.exit_code == 4 and "does not sign n@1" in r.json["error"]["message"]
