"""The trust policy: which public keys and which certificate authorities may sign a model's versions.

From the config file::

    [trust]                                   every model
    keys = ["keys/release.pub"]               trusted elliptic-curve public keys (PEM)
    roots = ["ca.pem", { cert = "ops-ca.pem", identities = ["release@example.com"] }]

    [models.llama.trust]                      this model only: replaces [trust] for it
    keys = ["keys/llama-release.pub"]

Relative paths are read from the config file's directory. A root without `identities` vouches for
any certificate it issued; with them, the signing certificate must name one of them (subject
common name or e-mail, or a subject alternative name).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.config import model_table
from registry.errors import UsageError


@dataclass(frozen=True)
class Root:
    """A trusted CA certificate and the identities it may sign for (empty: any)."""

    cert: Path
    identities: tuple[str, ...] = ()


@dataclass(frozen=True)
class TrustPolicy:
    """Trusted keys and roots for one model, and where they were configured."""

    keys: tuple[Path, ...] = ()
    roots: tuple[Root, ...] = ()
    #: Which table of the config file this came from (`[trust]`, `[models.NAME.trust]`), for messages.
    origin: str = "[trust]"

    @property
    def empty(self) -> bool:
        """Whether nothing is trusted (no policy configured)."""
        return not self.keys and not self.roots

    def describe(self) -> str:
        """One line naming what the policy trusts."""
        if self.empty:
            return f"{self.origin}: no trusted keys or roots"
        parts = [f"key {k.name}" for k in self.keys]
        parts += [f"root {r.cert.name}" + (f" for {', '.join(r.identities)}" if r.identities else "")
                  for r in self.roots]
        return f"{self.origin}: " + ", ".join(parts)


def policy_for(raw: dict[str, Any], name: str, base: Path) -> TrustPolicy:
    """The trust policy for model `name` from the config file's contents (`base`: its directory)."""
    table = model_table(raw, name).get("trust")
    if table is not None:
        return _parse(table, f"[models.{name}.trust]", base)
    if "trust" in raw:
        return _parse(raw["trust"], "[trust]", base)
    return TrustPolicy()


def _parse(table: object, origin: str, base: Path) -> TrustPolicy:
    if not isinstance(table, dict):
        raise UsageError(f"{origin} in the config file is not a table", hint='e.g. keys = ["release.pub"]')
    unknown = set(table) - {"keys", "roots"}
    if unknown:
        raise UsageError(f"unknown keys in {origin}: {', '.join(sorted(unknown))}", hint="known keys: keys, roots")
    keys = table.get("keys", [])
    if not isinstance(keys, list) or not all(isinstance(k, str) for k in keys):
        raise UsageError(f"{origin} keys must be a list of paths", hint='e.g. keys = ["release.pub"]')
    roots: list[Root] = []
    for r in table.get("roots", []) if isinstance(table.get("roots", []), list) else [None]:
        if isinstance(r, str):
            roots.append(Root(_path(base, r)))
        elif isinstance(r, dict) and isinstance(r.get("cert"), str) and set(r) <= {"cert", "identities"} \
                and isinstance(r.get("identities", []), list) \
                and all(isinstance(i, str) for i in r.get("identities", [])):
            roots.append(Root(_path(base, r["cert"]), tuple(r.get("identities", []))))
        else:
            raise UsageError(f"{origin} roots must be paths or {{ cert = PATH, identities = [...] }} tables",
                             hint='e.g. roots = ["ca.pem", { cert = "ops-ca.pem", identities = ["ci@example.com"] }]')
    return TrustPolicy(tuple(_path(base, k) for k in keys), tuple(roots), origin)


def _path(base: Path, text: str) -> Path:
    p = Path(text).expanduser()
    return p if p.is_absolute() else base / p
