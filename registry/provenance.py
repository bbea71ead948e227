"""Who, where, when: the provenance stamped on every record."""

from __future__ import annotations

import datetime as dt
import getpass
import os
import platform
import socket

from manifests import Provenance
from registry import __version__
from registry.config import MREG_USER
from registry.errors import UsageError

USER_ENV = MREG_USER.name
#: Longer than any account or CI job name; history lines stay readable.
MAX_USER = 256


def now() -> Provenance:
    """Provenance for a record made now by this process."""
    return Provenance(
        user=user(),
        host=_printable(socket.gethostname()),
        at=dt.datetime.now(dt.timezone.utc),
        mreg_version=__version__,
        python=platform.python_version(),
    )


def user() -> str:
    """Who is acting: $MREG_USER (refused unless one printable line: `mreg history` prints it), else the login."""
    given = MREG_USER.value()
    if given:
        if not given.isprintable() or len(given) > MAX_USER:
            raise UsageError(f"{USER_ENV} holds control characters or is longer than {MAX_USER} characters: "
                             f"{_printable(given[:80])!r}",
                             hint=f"set {USER_ENV} to a plain name such as ci-deploy (it is recorded in the history)")
        return given
    try:
        return _printable(getpass.getuser())[:MAX_USER]  # $LOGNAME or $USER first: escaped, not trusted
    except (KeyError, OSError):
        return f"uid:{os.getuid()}"


def _printable(text: str) -> str:
    """`text` with control and unprintable characters escaped, so that a record prints as one line."""
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
