"""Referrers (OCI distribution spec 1.1): manifests that point at another one through `subject`, and their lists.

Where a referrer list lives depends on the target::

    registry with the referrers API    GET /v2/<repo>/referrers/<digest>   (kept by the registry)
    registry without it (distribution  tag sha256-<hex>  → an image index   (kept by the pushing client:
      2.8, older Harbor/ECR, …)                                               read, append, PUT again)
    OCI image layout                   index.json entries, untagged, with artifactType and annotations

Each entry is a descriptor carrying the referrer's `artifactType` and annotations, so a reader picks
the ones it wants before fetching any. Pure functions here; the targets do the I/O. Nothing a list
says is trusted: a reader fetches each referrer by digest and checks what it holds.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from registry.errors import Conflict
from registry.oci import media

#: How a tag-schema index is found: the subject's digest with `:` replaced by `-`.
TAG_SCHEMA = re.compile(r"\Asha256-[0-9a-f]{64}\Z")


def tag_for(subject: str) -> str:
    """The referrers tag schema's tag for a subject digest (`sha256:ab…` → `sha256-ab…`)."""
    return subject.replace(":", "-", 1)


def descriptor(data: bytes, media_type: str) -> dict[str, Any]:
    """The list entry of a referrer manifest: its digest and size, its artifactType and every annotation."""
    doc = json.loads(data)
    d: dict[str, Any] = {"mediaType": media_type, "digest": "sha256:" + hashlib.sha256(data).hexdigest(),
                         "size": len(data)}
    kind = doc.get("artifactType") or (doc.get("config") or {}).get("mediaType")
    if kind:
        d["artifactType"] = kind
    if doc.get("annotations"):
        d["annotations"] = doc["annotations"]
    return d


def entries(data: bytes | None) -> list[dict[str, Any]]:
    """The descriptors an index lists ([] for anything that is not an index: the spec says no referrers)."""
    if data is None:
        return []
    try:
        doc = json.loads(data)
    except ValueError:
        return []
    if not isinstance(doc, dict) or not isinstance(doc.get("manifests"), list):
        return []
    return [m for m in doc["manifests"] if isinstance(m, dict)]


def updated(current: bytes | None, entry: dict[str, Any], where: str) -> bytes | None:
    """The tag-schema index with `entry` appended, or None when it is already listed (never a duplicate).

    A tag that names something other than an index is not ours to replace: Conflict.
    """
    doc: Any = {"schemaVersion": 2, "mediaType": media.OCI_INDEX, "manifests": []}
    if current is not None:
        try:
            doc = json.loads(current)
        except ValueError:
            doc = None
        if not isinstance(doc, dict) or not isinstance(doc.get("manifests"), list):
            raise Conflict(f"{where} is not an image index, so it is not a referrers list mreg can extend",
                           hint="delete that tag (it is the referrers tag schema's name) or push to another "
                                "repository; nothing was listed")
    if any(isinstance(m, dict) and m.get("digest") == entry["digest"] for m in doc["manifests"]):
        return None
    doc["manifests"].append(entry)
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def is_listing_entry(entry: dict[str, Any]) -> bool:
    """Whether an image layout's index.json entry is a referrer or a tag-schema list (not a tagged artifact)."""
    notes = entry.get("annotations") or {}
    name = notes.get(media.REF_NAME) if isinstance(notes, dict) else None
    if isinstance(name, str):
        return bool(TAG_SCHEMA.match(name))
    return "artifactType" in entry
