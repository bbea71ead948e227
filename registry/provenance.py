"""Who, where, when: the provenance stamped on every record."""

from __future__ import annotations

import datetime as dt
import getpass
import os
import platform
import socket

from manifests import Provenance
from registry import __version__


def now() -> Provenance:
    """Provenance for a record made now by this process."""
    try:
        user = os.environ.get("MREG_USER") or getpass.getuser()
    except (KeyError, OSError):
        user = f"uid:{os.getuid()}"
    return Provenance(
        user=user,
        host=socket.gethostname(),
        at=dt.datetime.now(dt.timezone.utc),
        mreg_version=__version__,
        python=platform.python_version(),
    )
