"""Giving memory freed by Python back to the system, so what a process holds is what it uses.

Loading a tokenizer parses its tokenizer.json into Python objects (about 90 MiB for Qwen's 151k
tokens and merges) and the Rust library allocates its own scratch; freed, most of that stays in the
C allocator's heap, counted in the process's RSS (a tokenizing worker: 289 MiB after loading
fastokens and the HF tokenizer, 172 MiB once trimmed; measured 2026-11-25, docs/BENCHMARKS.md).
glibc's ``malloc_trim`` hands the free pages back; elsewhere (another C library) nothing is done,
which changes only the memory, never a byte of the build. No garbage collection first: a parse has no
reference cycles, so it is freed the moment it is dropped (loading Qwen3's tokenizer.json, fastokens
and the HF tokenizer, then ``gc.collect()``: 0 objects collected, RSS 148 MiB after the trim without it,
146 MiB with it; 2026-11-26), while a collection walks every live object (0.15 s in a process
holding many, such as a test worker).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    name = ctypes.util.find_library("c")
    try:
        return ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):  # not glibc: no malloc_trim
        return None


def release_freed() -> None:
    """Hand the allocator's free memory back to the system (glibc)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
