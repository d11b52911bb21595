"""The KV bound's books (model/kv/bound.py): reservations that grow, and the banker's rule that
keeps every running reply able to finish."""

from __future__ import annotations

from sidecar.model.kv.bound import Memory


def test_a_reply_alone_always_starts() -> None:
    assert Memory(100).fits(500, 900)


def test_a_whole_reservation_fits_as_before() -> None:
    """The Generator path's rule, unchanged: a reservation that is its whole need fits if the
    bound holds it beside the others."""
    memory = Memory(100, set_aside=10)
    memory.reserve(1, 50, 50)
    assert memory.fits(40) and not memory.fits(41)


def test_a_large_need_does_not_hold_the_bound_up_front() -> None:
    """A reply that may write 900 reserves 100: a short one starts beside it, since the
    short one can finish, and then the long one can grow to its whole length."""
    memory = Memory(1000)
    memory.reserve(1, 100, 900)
    assert memory.fits(80, 80)
    memory.reserve(2, 80, 80)
    assert memory.reserved_bytes == 180


def test_a_start_that_would_leave_no_reply_able_to_finish_waits() -> None:
    memory = Memory(1000)
    memory.reserve(1, 300, 900)  # needs 600 more
    # 300 + 300 reserved, 400 free: neither could grow to its end before the other left
    assert not memory.fits(300, 900)
    assert memory.fits(300, 700)  # this one needs 400: it can finish, then the first


def test_growth_is_refused_where_it_would_strand_the_others_and_given_later() -> None:
    memory = Memory(1000)
    memory.reserve(1, 300, 600)
    memory.reserve(2, 300, 700)
    assert memory.grow(1, 300)  # 1 reaches its whole length: it can finish, then 2
    assert 1 not in memory.growing
    assert not memory.grow(2, 200)  # over the bound
    memory.release(1, 600)
    assert memory.grow(2, 200)
    assert memory.reserved_bytes == 500 and memory.growing == {2: (500, 700)}


def test_some_reply_can_always_go_on() -> None:
    """Whatever was admitted, at each step some reply grows or, fully reserved, finishes:
    no state where every reply waits."""
    memory = Memory(1000)
    starts = [(100, 500), (100, 400), (100, 300), (100, 600)]
    held = {}
    for key, (first, need) in enumerate(starts):
        if memory.fits(first, need):
            memory.reserve(key, first, need)
            held[key] = first
    assert len(held) == 4
    while held:
        grown = [k for k in list(memory.growing) if memory.grow(k, 50)]
        for key in grown:
            held[key] += 50
        done = [k for k in held if k not in memory.growing]  # whole length: it finishes
        assert grown or done, memory
        for key in done:
            memory.release(key, held.pop(key))
    assert memory.reserved_bytes == 0
