"""`mreg sign`: signing a version with OpenSSF model-signing (key or certificate), or keeping a bundle made elsewhere;
and how signatures and their verdicts are rendered by `show` and `verify --signatures`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from registry import api
from registry.cli.options import config_option, json_option, local_store, settings_for, store_option
from registry.cli.render import Output
from registry.errors import UsageError

if TYPE_CHECKING:
    from manifests import SignatureRecord
    from registry.store.protocol import Store, Version
    from registry.store.signatures import SignatureResult
    from registry.store.trust import TrustPolicy

_MARK = {"valid": "✓", "invalid": "✗", "untrusted": "?"}


def record_doc(rec: SignatureRecord) -> dict[str, Any]:
    """A signature record without its bundle (what `show` and `sign` report)."""
    return {"signer": rec.signer, "method": rec.method, "key_id": rec.key_id, "at": rec.at.isoformat(),
            "origin": rec.origin, "manifest_sha256": rec.manifest_sha256,
            "by": f"{rec.by.user}@{rec.by.host}"}


def result_doc(res: SignatureResult) -> dict[str, Any]:
    """A verdict on one signature."""
    return {**record_doc(res.record), "status": res.status, "reason": res.reason, "trusted_by": res.trusted_by}


def result_line(res: SignatureResult) -> str:
    """One line per verdict: mark, signer, key id, time, status and why."""
    r = res.record
    return (f"{_MARK[res.status]} {r.signer} ({r.method} {r.key_id[:12]}…, {r.at.isoformat()[:19]}): "
            f"{res.status}, {res.reason}")


def shown_signatures(store: Store, version: Version, trust: TrustPolicy) -> tuple[list[dict[str, Any]], list[str]]:
    """What `show` lists: each signature judged against the manifest (the bytes are `verify`'s job); where
    model-signing is not installed (a serving node with the core only), the records, unchecked."""
    try:
        judged = api.verify_signatures(store, version, trust, rehash=False)
    except UsageError as e:
        records = store.signatures(version.name, version.number)
        why = f"{e}; {e.hint}" if e.hint else str(e)
        return ([{**record_doc(r), "status": "unchecked", "reason": why, "trusted_by": None} for r in records],
                [f"- {r.signer} ({r.method} {r.key_id[:12]}…, {r.at.isoformat()[:19]}): unchecked, {why}"
                 for r in records])
    return [result_doc(r) for r in judged], [result_line(r) for r in judged]


@click.command("sign")
@click.argument("ref", metavar="NAME@REF")
@click.option("--key", type=click.Path(dir_okay=False, path_type=Path), help="PEM elliptic-curve private key.")
@click.option("--certificate", type=click.Path(dir_okay=False, path_type=Path),
              help="The key's signing certificate (PEM): a certificate signature instead of a bare key.")
@click.option("--chain", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Intermediate and root certificates of --certificate (repeat, or one PEM file with several).")
@click.option("--password-env", metavar="VAR", help="Read the private key's password from this variable.")
@click.option("--signer", metavar="NAME", help="Who signs, as shown (default: the certificate subject, or user@host).")
@click.option("--import", "import_bundle", type=click.Path(dir_okay=False, path_type=Path), metavar="SIG",
              help="Keep a bundle made by `model_signing sign … ` on the version directory instead of signing.")
@config_option
@store_option
@json_option
def sign_cmd(ref: str, key: Path | None, certificate: Path | None, chain: tuple[Path, ...], password_env: str | None,
             signer: str | None, import_bundle: Path | None, config_path: str | None, store: str | None,
             as_json: bool) -> None:
    """Sign a version with OpenSSF model-signing, offline: every file its manifest lists, and the manifest.

    The signature (a Sigstore bundle over an in-toto statement of each file's sha256) is kept
    beside the version, which is not changed; several signers may sign. `verify --signatures`
    judges signatures against the `[trust]` policy, and `promote --require signature` insists on
    a valid one. The files are hashed and checked against the manifest first (exit 4 if they differ).
    """
    password = os.environ.get(password_env) if password_env else None
    st = local_store(settings_for(config_path, store=store))
    rec = api.sign(st, ref, key=key, certificate=certificate, chain=chain, password=password, signer=signer,
                   import_bundle=import_bundle)
    doc = {"name": rec.name, "version": rec.version, **record_doc(rec)}
    verb = "imported a signature of" if rec.origin == "import" else "signed"
    Output(as_json).result(doc, f"✓ {verb} {rec.name}@{rec.version} as {rec.signer} "
                                f"({rec.method} {rec.key_id[:12]}…)")
