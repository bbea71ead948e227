"""Freed memory kept while a GGUF file streams (converters.gguf.heap): set here, handed to the children."""

from __future__ import annotations

import os
import subprocess
import sys

from converters.gguf import heap, overlap


def test_the_children_get_the_tunables_and_a_users_own_value_wins() -> None:
    env = heap.child_env({"PATH": "/bin", "MALLOC_TRIM_THRESHOLD_": "0"})
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(32 << 20) and env["MALLOC_TOP_PAD_"] == str(16 << 20)
    assert env["MALLOC_TRIM_THRESHOLD_"] == "0" and env["PATH"] == "/bin"
    assert overlap.child_env()["MALLOC_MMAP_THRESHOLD_"] == os.environ.get("MALLOC_MMAP_THRESHOLD_", str(32 << 20))


def test_mallopt_takes_them_in_this_process() -> None:
    """In a fresh interpreter (the setting is once per process): glibc accepts every value."""
    code = "from converters.gguf import heap; print(heap.keep_freed_memory())"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == ("True" if os.uname().sysname == "Linux" else out.stdout.strip())
