"""`mreg sign`: signing a version with OpenSSF model-signing (key or certificate), or keeping a bundle made elsewhere;
and how signatures and their verdicts are rendered by `show` and `verify --signatures`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from registry import api, config
from registry.cli.options import config_option, json_option, local_store, settings_for, store_option
from registry.cli.render import Output

_MARK = {"valid": "✓", "invalid": "✗", "untrusted": "?", "unchecked": "-"}


def result_line(doc: dict[str, Any]) -> str:
    """One line per verdict (a `result_doc`): mark, signer, key id, time, status and why."""
    return (f"{_MARK[doc['status']]} {doc['signer']} ({doc['method']} {doc['key_id'][:12]}…, {doc['at'][:19]}): "
            f"{doc['status']}, {doc['reason']}")


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
    password = config.named(password_env) if password_env else None
    st = local_store(settings_for(config_path, store=store))
    rec = api.sign(st, ref, key=key, certificate=certificate, chain=chain, password=password, signer=signer,
                   import_bundle=import_bundle)
    from registry.store.signatures import record_doc

    doc = {"name": rec.name, "version": rec.version, **record_doc(rec)}
    verb = "imported a signature of" if rec.origin == "import" else "signed"
    Output(as_json).result(doc, f"✓ {verb} {rec.name}@{rec.version} as {rec.signer} "
                                f"({rec.method} {rec.key_id[:12]}…)")
