"""kv_pages: two page-aligned regions exchanged by moving their pages (Linux's mremap)."""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest

from sidecar.model.kv import pages as kv_pages

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's mremap")


def regions(pages: int) -> tuple[mmap.mmap, np.ndarray]:
    area = mmap.mmap(-1, 3 * pages * mmap.PAGESIZE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return area, np.frombuffer(area, np.uint8)


def test_two_regions_exchange_their_contents_and_the_third_is_untouched() -> None:
    size = 4 * mmap.PAGESIZE
    area, view = regions(4)
    view[:size], view[size : 2 * size] = 1, 2
    base = view.ctypes.data
    assert kv_pages.exchange(base, base + size, size)
    assert (view[:size] == 2).all() and (view[size : 2 * size] == 1).all()
    assert not view[2 * size :].any()
    # A written region and one never written: the pages go, the unwritten reads as zeros
    assert kv_pages.exchange(base + size, base + 2 * size, size)
    assert not view[size : 2 * size].any() and (view[2 * size :] == 1).all()
    view[:] = 0  # still ordinary memory, all of it
    del view
    area.close()


def test_what_cannot_be_moved_is_refused_and_left_as_it_was() -> None:
    size = 2 * mmap.PAGESIZE
    area, view = regions(2)
    view[:size], view[size : 2 * size] = 1, 2
    base = view.ctypes.data
    assert not kv_pages.exchange(base + 1, base + size + 1, size - 1)  # not page-aligned
    assert kv_pages.exchange(base, base, size)  # a region with itself: nothing to do
    assert (view[:size] == 1).all() and (view[size : 2 * size] == 2).all()
    del view
    area.close()
