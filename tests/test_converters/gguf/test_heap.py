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


#: In a fresh interpreter (the allocator is the process's): where a 1 MiB block comes from, inside the scope (the
#: heap: the mmap threshold is 32 MiB) and after it (an mmap of its own again, as glibc's own 128 KiB threshold says,
#: once the free memory the scope kept is trimmed: glibc gives it back at the next free that reaches the top).
_PROBE = """
import ctypes
from converters.gguf import heap

class Info(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]

libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
libc.mallinfo2.restype = Info

def mapped() -> bool:
    before = libc.mallinfo2().hblks
    block = libc.malloc(1 << 20)
    try:
        return libc.mallinfo2().hblks > before
    finally:
        libc.free(block)

with heap.freed_memory_kept() as took, heap.freed_memory_kept() as again:
    inside = mapped()
libc.malloc_trim(0)
print(took, again, inside, mapped())
"""


def test_mallopt_takes_them_for_the_conversion_and_gives_glibcs_back() -> None:
    """Overlapping scopes set them once; the last one out puts glibc's values back (its allocator is the host's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env, check=True)
    if os.uname().sysname == "Linux":
        assert out.stdout.split() == ["True", "True", "False", "True"]
