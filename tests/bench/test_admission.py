"""bench.admission's statistics: the median of paired differences and its interval."""

from __future__ import annotations

import math

from bench.admission import median_interval, paired


def test_the_median_interval_is_the_binomial_order_statistics():
    # the textbook ranks (1-based) of a 95% interval for the median: 3..10 of 12, 6..15 of 20
    assert median_interval(12) == (2, 9)
    assert median_interval(20) == (5, 14)
    assert median_interval(4) == (0, 3)  # too few for 95%: the extremes
    for n in (8, 12, 24, 40):
        k, _ = median_interval(n)
        coverage = sum(math.comb(n, i) for i in range(k + 1, n - k)) / 2**n
        assert coverage >= 0.95


def test_paired_reports_the_median_difference_and_its_interval():
    plain = [{"cpu_ms": 1.0} for _ in range(12)]
    limited = [
        {"cpu_ms": 1.0 + d} for d in (0.5, -0.2, 0.1, 0.3, 0.0, 0.2, 0.4, 0.1, 9.0, 0.2, 0.3, 0.1)
    ]
    out = paired(plain, limited, "cpu_ms")
    assert math.isclose(out["added"], 0.2)  # the 9.0 spike moves one difference, not this
    assert out["added_lo"] <= out["added"] <= out["added_hi"] < 9.0
