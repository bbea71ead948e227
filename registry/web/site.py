"""`mreg site build OUT`: every page of the store written as static files, for any web server or a share.

The site is built in a new directory beside OUT and renamed into place, so a web server serving OUT
shows the old site or the new one, never half of each. OUT must be absent, empty, or a site mreg built
(it holds `MARKER`): another directory is never replaced.
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from registry.errors import UsageError
from registry.web import documents, pages

MARKER = ".mreg-site"


@dataclass(frozen=True)
class SiteBuild:
    """What a build wrote."""

    out: Path
    pages: int
    files: int
    seconds: float


def build(reader: documents.Reader, out: Path) -> SiteBuild:
    """Write every page (and its JSON twin) of the store under `out`."""
    started = time.perf_counter()
    out = out.expanduser().absolute()
    if out.exists() and not (out.is_dir() and (not any(out.iterdir()) or (out / MARKER).is_file())):
        raise UsageError(f"{out} exists and is not a site mreg built",
                         hint="give a new or empty directory (a site mreg built is replaced as a whole)")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    try:
        site = pages.Site(reader, live=False)
        paths = pages.site_pages(reader)

        files = 0
        for rel, body in pages.rendered(site, paths):
            _write(work, rel, body)
            files += 1
        (work / MARKER).write_text("a static site written by `mreg site build`; rebuilt as a whole\n")
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}" if out.exists() else None
        if old is not None:
            os.rename(out, old)
        os.rename(work, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return SiteBuild(out, len(paths), files, time.perf_counter() - started)


def _write(root: Path, rel: str, body: bytes) -> None:
    dest = root / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(body)
