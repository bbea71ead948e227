"""The one policy for running llama.cpp: in a child process, weights read from the mapped file (no repacking).

llama.cpp's CPU backend copies Q4_0/Q4_K/IQ4 weights into "extra buffer" layouts for its optimized
kernels; on CPUs with AMX (Sapphire Rapids and later) those kernels crash the process (SIGSEGV),
and the copy costs anonymous memory besides (500 MB for a 1.1 B Q4_K_M). Reading the weights from
the mapped file (`use_extra_bufts=False`, llama.cpp's `--no-repack`) computes the same logits on
every CPU. Every place mreg runs llama.cpp (conversion's verification, `mreg check`) loads through
`load` here, in a child process, so that a native crash becomes a one-line error, not mreg's death.
"""

from __future__ import annotations

import importlib
import signal
from pathlib import Path
from typing import Any

from registry.errors import RuntimeCrashed

#: What the policy sets, recorded with every result that llama.cpp produced.
SETTINGS = {"use_extra_bufts": False, "use_mmap": True}


def crashed(doing: str, returncode: int | None, tail: str) -> RuntimeCrashed:
    """The error for a llama.cpp child that died: the signal named, and what to do."""
    return RuntimeCrashed(
        f"llama.cpp crashed ({describe_exit(returncode)}) while {doing}" + (f": {tail}" if tail else ""),
        hint="mreg is unharmed and recorded nothing; llama.cpp already runs without its repacked CPU kernels "
             "(use_extra_bufts=False, as `--no-repack`); try another llama-cpp-python build or CPU type, and "
             "report the model and `lscpu` upstream",
        returncode=returncode,
    )


def describe_exit(returncode: int | None) -> str:
    """`-11` → "killed by SIGSEGV"; `3` → "exit 3"."""
    if returncode is None:
        return "no exit status"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit {returncode}"


def load(path: Path, **kwargs: Any) -> Any:
    """A `llama_cpp.Llama` on `path` under the policy (call it in a child process)."""
    llama_cpp: Any = importlib.import_module("llama_cpp")
    defaults = llama_cpp.llama_cpp.llama_model_default_params

    def with_policy() -> Any:
        params = defaults()
        for key, value in SETTINGS.items():
            setattr(params, key, value)
        return params

    # llama-cpp-python builds its model parameters from this function and offers no argument for the field.
    llama_cpp.llama_cpp.llama_model_default_params = with_policy
    try:
        return llama_cpp.Llama(model_path=str(path), verbose=False, **kwargs)
    finally:
        llama_cpp.llama_cpp.llama_model_default_params = defaults
