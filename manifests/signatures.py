"""Signature records: an OpenSSF model-signing bundle over a version, and who says they made it.

The bundle (a Sigstore bundle holding a DSSE envelope of an in-toto statement: every file's sha256,
the manifest's included) is what proves anything; the rest is what the signer claimed, shown to
people, never trusted by a verdict.
"""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from manifests.models import SCHEMA_VERSION, Provenance, Sha256


class SignatureRecord(BaseModel):
    """One signature of one version, kept beside it (append-only; several signers allowed)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = SCHEMA_VERSION
    name: str
    version: int = Field(ge=1)
    #: The manifest the signature covers (also one of the signed files: the bundle is what proves it).
    manifest_sha256: Sha256
    #: `key`: an elliptic-curve key (the bundle names its public key's sha256); `certificate`: a signing
    #: certificate and its chain in the bundle.
    method: Literal["key", "certificate"]
    #: sha256 of the signer's public key in PEM (SubjectPublicKeyInfo): the key id model-signing writes.
    key_id: Sha256
    #: Who signed, as claimed (`--signer`), or the certificate's subject.
    signer: str
    at: dt.datetime
    by: Provenance
    #: `sign` (made by mreg) or `import` (a bundle made elsewhere, e.g. by the model_signing CLI).
    origin: Literal["sign", "import"] = "sign"
    #: The Sigstore bundle exactly as model-signing writes it (`model_signing verify … --signature FILE`).
    bundle: dict[str, Any]
