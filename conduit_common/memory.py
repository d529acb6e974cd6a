"""Handing freed heap memory back to the operating system.

glibc keeps memory a process has freed in its heap for later allocations. Loading a model frees a
lot at once (the weights' conversions and quantization pass through temporary copies): for the
default model ~350 MB of an engine's ~1.3 GB stayed resident, unused, for the process's life.
"""

from __future__ import annotations

import ctypes
import ctypes.util


def release_freed_memory() -> None:
    """malloc_trim(0): free heap pages back to the OS. A no-op where libc is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.malloc_trim(0)
    except (OSError, AttributeError):
        pass
