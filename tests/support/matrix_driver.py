"""A small local job engine: runs each entry of an emitted GitHub Actions matrix as its own `mreg convert --matrix M
--item N --json` process, a few at a time, as CI runners would (used by the fan-out tests and benchmarks/)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

#: The `mreg` console entry point, run by this interpreter (the installed script may be another checkout's).
MREG = [sys.executable, "-c", "from registry.cli import run; run()"]


def run_item(matrix: Path, item: int, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """One item in its own process; its JSON document, with `exit_code` added."""
    done = subprocess.run([*MREG, "convert", "--matrix", str(matrix), "--item", str(item), "--json"],
                          capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=600, check=False)
    try:
        doc: dict[str, Any] = json.loads(done.stdout)
    except ValueError:
        doc = {"stdout": done.stdout}
    return {**doc, "exit_code": done.returncode, "stderr": done.stderr[-2000:]}


def run_matrix(matrix: Path, include: Sequence[Mapping[str, Any]], *, workers: int,
               env: Mapping[str, str] | None = None) -> tuple[list[dict[str, Any]], float]:
    """Every entry of a `strategy.matrix` (`include`), `workers` at a time: their documents in order, and the wall
    time of the whole run in seconds."""
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        docs = list(pool.map(lambda entry: run_item(matrix, int(entry["item"]), env), include))
    return docs, time.monotonic() - started
