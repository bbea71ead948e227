"""One output object for humans and CI: data to stdout, progress and errors to stderr."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from registry.errors import MregError, retryable

SCHEMA_VERSION = 1


def _encode(value: Any) -> Any:
    """What json cannot write itself: a pydantic model as its own JSON (non-finite numbers as null), else str."""
    dump = getattr(value, "model_dump_json", None)
    return json.loads(dump()) if callable(dump) else str(value)


def one_line(text: str) -> str:
    """`text` with every control or unprintable character escaped (a file named "x\\nerror: …" cannot forge a
    second line; an undecodable name cannot break the stream's encoding)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class Output:
    """Renders a command's result as text or as one JSON document."""

    def __init__(self, json_mode: bool) -> None:
        self.json = json_mode

    def result(self, doc: dict[str, Any], human: Callable[[], str] | str, *, failure: MregError | None = None) -> None:
        """Print the command's result; a report that fails (`failure`) carries its error in the same document."""
        if self.json:
            if failure is not None:  # CI reads one document: the report and, as for any failure, its "error"
                doc = {**doc, "error": error_doc(failure)}
            sys.stdout.write(json.dumps({"schema_version": SCHEMA_VERSION, **doc}, default=str) + "\n")
        else:
            text = human() if callable(human) else human
            if text:
                sys.stdout.write(text.rstrip("\n") + "\n")
        sys.stdout.flush()

    def warn(self, message: str) -> None:
        """A warning, always on stderr."""
        sys.stderr.write(f"warning: {message}\n")

    def error(self, err: MregError) -> None:
        """An error: one line and a hint on stderr; with --json also a document on stdout."""
        sys.stderr.write(f"error: {one_line(str(err))}\n")
        if err.hint:
            sys.stderr.write(f"hint: {one_line(err.hint)}\n")
        if self.json:
            self.document(err)

    def document(self, err: MregError) -> None:
        """The error as the one JSON document on stdout."""
        sys.stdout.write(json.dumps({"schema_version": SCHEMA_VERSION, "error": error_doc(err)}) + "\n")


def error_doc(err: MregError) -> dict[str, Any]:
    """An error as `--json` writes it, ready for json.dumps (its details already encoded)."""
    error: dict[str, Any] = {"type": type(err).__name__, "message": one_line(str(err)),
                             "hint": one_line(err.hint) if err.hint else err.hint, "exit_code": err.exit_code,
                             "retryable": retryable(err.exit_code)}
    if err.details is not None:
        error["details"] = json.loads(json.dumps(err.details, default=_encode))
    return error


class BarProgress:
    """Progress bars on stderr (tqdm), one per task; silent when stderr is not a terminal."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._bar: Any = None

    def start(self, desc: str, total: int | None, unit: str = "B") -> None:
        """Open a bar."""
        self.done()
        if not self.enabled:
            return
        from tqdm import tqdm

        self._bar = tqdm(total=total, desc=desc, unit=unit, unit_scale=True, unit_divisor=1024,
                         file=sys.stderr, leave=False, dynamic_ncols=True)

    def advance(self, n: int) -> None:
        """Move the bar."""
        if self._bar is not None:
            self._bar.update(n)

    def done(self) -> None:
        """Close the bar."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def table(rows: list[list[str]], header: list[str]) -> str:
    """A plain aligned text table; a cell holding a newline (a name, a reason, a user someone typed) stays in its
    row instead of forging one."""
    rows = [[one_line(str(c)) for c in r] for r in rows]
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)).rstrip()]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip() for r in rows]
    return "\n".join(lines)
