"""llama-cpp-python as if it were not installed, for the tests of a plain `pip install mreg`."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

_ABSENT = object()


def _forget_found_libraries() -> None:
    """Drop what the GGUF encoders cached about llama.cpp's libraries (found or not), so that neither the absence
    nor the presence leaks into the tests that run after."""
    from converters.gguf import quants

    for cached in (quants._ggml_quantize_chunk, quants._ggml_cpu_converter):
        cached.cache_clear()


@contextlib.contextmanager
def without_llama_cpp() -> Iterator[None]:
    """`import llama_cpp` raises and find_spec gives None for the body; only its entry of sys.modules is put back
    (mock.patch.dict would drop every module first imported meanwhile, and their classes with them)."""
    saved = sys.modules.get("llama_cpp", _ABSENT)
    sys.modules["llama_cpp"] = None  # type: ignore[assignment]
    _forget_found_libraries()
    try:
        yield
    finally:
        if saved is _ABSENT:
            del sys.modules["llama_cpp"]
        else:
            sys.modules["llama_cpp"] = saved  # type: ignore[assignment]
        _forget_found_libraries()
