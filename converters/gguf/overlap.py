"""The float32 reference pass started before the GGUF file is written, in a child process beside the write.

The reference reads only the safetensors source and its tokenizer, so it need not wait for the file:
`start` launches it as the write begins (`converters.gguf.verify.run_reference`), and it saves the
evaluated ids and logits beside the reference cache's name, one file per token sequence
(`.mreg-reference-<ids digest>.npz`, written under a temporary name and renamed), which the
verification child reads instead of computing them
(`converters.gguf.verify.run_runtime`, which still checks that the ids saved are the ones it
evaluates). The child holds an exclusive lock on `<cache>.lock` from before it starts until it
exits (the parent takes it and hands the descriptor over), and the verification child takes it
shared before it looks: it waits for the pass, never reads half a cache, and where the pass failed
or was killed finds no cache and computes the reference itself, as it does without the overlap.
Nothing here decides a verification: it only moves when the reference is computed.

```
<source links>/.mreg-reference-<sha256(ids)[:16]>.npz   ids, logits (float32), one per token sequence
<source links>/.mreg-reference.npz.lock                 held by the reference child while it runs
```
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from converters.gguf import heap
from registry import layout
from registry.config import inherited, python_path


@dataclass
class Ahead:
    """A reference pass running in a child process, and the cache it fills."""

    process: subprocess.Popen[str]
    cache: Path


def child_env() -> dict[str, str]:
    """The environment of a child that runs mreg's code (the runtime check, the reference pass)."""
    root = Path(__file__).resolve().parents[2]
    # The reference forward pass runs its own thread pool: OpenBLAS threads on top of it are many times slower.
    # Both children stream the weights block by block, so they keep freed memory as the writer does (heap).
    return heap.child_env(inherited(PYTHONPATH=python_path(root), OPENBLAS_NUM_THREADS="1"))


def lock_path(cache: Path) -> Path:
    """The lock the reference child holds while it computes `cache`."""
    return layout.lock_beside(cache)


def start(directory: Path, cache: Path, evaluation: tuple[Path, int] | None) -> Ahead:
    """Start the reference pass on the source in `directory` (the prompt, or the evaluation text's first tokens)."""
    cmd = [sys.executable, "-m", "converters.gguf.verify", "--reference", str(directory), str(cache)]
    if evaluation is not None:
        cmd += [str(evaluation[0]), str(evaluation[1])]
    fd = os.open(lock_path(cache), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # taken before the child exists: a reader can never come first
        process = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL, text=True, env=child_env(), pass_fds=(fd,),
                                   preexec_fn=_death_signal())
    finally:
        os.close(fd)  # the child's copy of the descriptor keeps the lock until it exits
    return Ahead(process, cache)


def finish(ahead: Ahead) -> float | None:
    """Wait for the pass; its seconds, or None when it saved nothing (the verification then computed it)."""
    stdout, _ = ahead.process.communicate()
    if ahead.process.returncode != 0 or not stdout.strip():
        return None
    seconds = json.loads(stdout.strip().splitlines()[-1]).get("seconds")
    return float(seconds) if seconds is not None else None


def stop(ahead: Ahead) -> None:
    """End the pass (the conversion failed or was interrupted)."""
    if ahead.process.poll() is None:
        ahead.process.kill()
    ahead.process.wait()
    if ahead.process.stdout is not None:
        ahead.process.stdout.close()


def wait_for(cache: Path) -> None:
    """Wait until no reference child holds `cache`'s lock (none started: at once)."""
    try:
        fd = os.open(lock_path(cache), os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
    finally:
        os.close(fd)


def _death_signal() -> Callable[[], None] | None:
    """What the child runs before exec: ask for SIGKILL when the converting process dies (Linux's prctl), so no
    pass outlives a killed conversion; None where there is no prctl. Looked up here: the child only calls it."""
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def request() -> None:
        prctl(pr_set_pdeathsig, signal.SIGKILL)

    return request
