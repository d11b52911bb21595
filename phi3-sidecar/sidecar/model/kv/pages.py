"""Exchanging two page-aligned regions of memory by moving their pages, not their bytes.

The batched path keeps its decoding rows in adjacent KV slots (one model call binds a run of
slots), so a reply that starts decoding, or one that leaves, exchanges its slot with another
(batch.slots._swap). Copying costs a pass over both conversations' K/V: a new chat's first
token waited for an idle 454-token conversation's 340 MB to be copied twice (py-spy on the
first-word bench: 0.9 s of a 2.2 s first token, on generated phi3-mini shapes). Linux's
mremap moves a region's page-table entries instead, whatever the region holds: three moves,
through a scratch address range, exchange two slots in microseconds, and each conversation's
pages (its memory, as the cache counts it) go with it.

Linux only, page-aligned regions only; `exchange` returns False where it cannot move pages
(another system, an error from the kernel) and the caller copies instead. A failure part-way
puts back what it moved.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys

_MREMAP_MAYMOVE = 1
_MREMAP_FIXED = 2
_MAP_FAILED = ctypes.c_void_p(-1).value
# Linux's MAP_NORESERVE: no swap or commit reserved for pages never written (the KV pool's
# own mapping and the scratch range here)
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
# Linux's MADV_POPULATE_WRITE (5.14): map a range's pages now, as writes would, leaving what
# they hold as it is (kv/warm.py). Python's mmap module does not name it.
MADV_POPULATE_WRITE = 23


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.mremap.restype = ctypes.c_void_p
        libc.mremap.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p,
        ]  # fmt: skip
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [
            ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
            ctypes.c_long,
        ]  # fmt: skip
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def available() -> bool:
    return _LIBC is not None


def _move(source: int, target: int, size: int) -> bool:
    """Move the pages of [source, source + size) to `target` (replacing what was mapped
    there); the source range is left unmapped."""
    assert _LIBC is not None
    flags = _MREMAP_MAYMOVE | _MREMAP_FIXED
    return bool(_LIBC.mremap(source, size, size, flags, target) == target)


def exchange(first: int, second: int, size: int) -> bool:
    """Exchange the pages of [first, first + size) and [second, second + size): two
    page-aligned, non-overlapping regions of private anonymous mappings (each within one
    mapping). True when done; False when nothing was changed (copy instead)."""
    if first == second:
        return True
    if _LIBC is None or size <= 0:
        return False
    if first % mmap.PAGESIZE or second % mmap.PAGESIZE or size % mmap.PAGESIZE:
        return False
    # A scratch range of the kernel's choosing to park the first region's pages in
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE
    scratch = _LIBC.mmap(None, size, 0, flags, -1, 0)  # PROT_NONE: never read or written
    if scratch is None or scratch == _MAP_FAILED:
        return False
    if not _move(first, scratch, size):
        _LIBC.munmap(scratch, size)
        return False
    if not _move(second, first, size):
        if not _move(scratch, first, size):  # put it back
            raise OSError(ctypes.get_errno(), "mremap could not put a KV slot's pages back")
        return False
    if not _move(scratch, second, size):
        if not (_move(first, second, size) and _move(scratch, first, size)):
            raise OSError(ctypes.get_errno(), "mremap could not put a KV slot's pages back")
        return False
    return True
