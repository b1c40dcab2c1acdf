"""A share's blocks follow the rate it is spent at; the cap still bounds every block."""

from __future__ import annotations

from gateway.access.shares import MAX_SCALE, RATE_S, Share, grant


def test_a_share_spent_fast_asks_for_bigger_blocks_and_a_slow_one_for_smaller():
    s = Share()
    assert s.rescale(100.0) == 1  # the first refill: no rate known yet
    assert s.rescale(100.0 + RATE_S / 2) == 2
    assert s.rescale(100.0 + RATE_S) == 4
    for i in range(10):
        s.rescale(101.0 + i * RATE_S / 4)
    assert s.scale == MAX_SCALE
    assert s.rescale(200.0) == MAX_SCALE // 2  # spent slowly: halved
    assert s.rescale(200.0 + 1.5 * RATE_S) == MAX_SCALE // 2  # in between: kept


def test_a_scaled_block_is_still_bounded_by_the_cap():
    amount, scale, cap = 50, MAX_SCALE, 1_000_000
    asked = amount * scale
    granted = grant(cap, cap, asked)
    assert granted - asked == cap // 64  # a block: at most 1/64 of the cap
    # near the cap: the reservation alone, however fast the share is spent
    assert grant(cap, asked + 3 * (cap // 64), asked) == asked
