"""bench.context_measure: the answer's score, the bootstrap interval, and the prefix-cache
counters read from a vLLM 0.32 ``/metrics`` page (an excerpt of a real one)."""

from __future__ import annotations

import httpx
import pytest

from bench.context_measure import (
    GENERATION_TAIL,
    PrefixCache,
    Score,
    Tally,
    bootstrap_ci,
    extends,
    paired_ratio_ci,
    parse_prefix_counters,
    score,
)

METRICS = """\
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="smollm2-135m"} 3300.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{engine="0",model_name="smollm2-135m"} 1.79624040502511e+09
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="smollm2-135m"} 1200.0
vllm:prefix_cache_hits_total{engine="1",model_name="smollm2-135m"} 16.0
vllm:prefix_cache_hits_created{engine="0",model_name="smollm2-135m"} 1.79624040502511e+09
"""


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("41234", Score(exact=True, normalised=True)),
        (" '41234'.\n", Score(exact=True, normalised=True)),
        ("41,234", Score(exact=False, normalised=True)),
        ("The number is 41234.", Score(exact=False, normalised=True)),
        ("port_3 = 41234", Score(exact=False, normalised=False)),  # its first number is 3
        ("12345 or 41234", Score(exact=False, normalised=False)),  # not a later guess
        ("412345", Score(exact=False, normalised=False)),
        ("", Score(exact=False, normalised=False)),
        ("I don't know", Score(exact=False, normalised=False)),
    ],
)
def test_score_credits_the_value_alone_or_as_the_first_number(answer: str, expected: Score) -> None:
    assert score(answer, "41234") == expected


def test_bootstrap_ci_brackets_the_mean_and_collapses_when_every_session_agrees() -> None:
    outcomes = [True] * 12 + [False] * 8
    lo, hi = bootstrap_ci(outcomes, seed=1)
    assert lo < 0.6 < hi and lo > 0.3 and hi < 0.85
    assert bootstrap_ci(outcomes, seed=1) == (lo, hi)  # seeded: the same interval
    assert bootstrap_ci([True] * 5) == (1.0, 1.0)
    assert bootstrap_ci([False] * 5) == (0.0, 0.0)
    assert bootstrap_ci([]) == (0.0, 0.0)


def test_paired_ratio_ci_resamples_sessions_for_both_arms_together() -> None:
    base = [1.0] * 15 + [0.5] * 5
    mine = [1.0] * 12 + [0.0] * 3 + [0.5] * 5  # the same sessions: 0.85 of base's
    ci = paired_ratio_ci(mine, base, seed=3)
    assert ci is not None
    lo, hi = ci
    assert lo < round(sum(mine) / sum(base), 3) < hi and hi <= 1.0
    assert paired_ratio_ci(mine, base, seed=3) == ci  # seeded: the same interval
    assert paired_ratio_ci(base, base) == (1.0, 1.0)  # paired: no spread when arms agree
    # degenerate: nothing to compare on, base right on nothing, arms on other sessions
    assert paired_ratio_ci([], []) is None
    assert paired_ratio_ci([1.0, 0.5], [0.0, 0.0]) is None
    assert paired_ratio_ci([1.0], [1.0, 1.0]) is None
    # a draw where base is right on nothing has no ratio and is left out, not a crash
    ci = paired_ratio_ci([1.0, 1.0], [1.0, 0.0], rounds=200, seed=1)
    assert ci is not None and 1.0 <= ci[0] <= ci[1] <= 2.0


def test_a_row_against_none_has_the_paired_interval_and_none_when_none_is_never_right() -> None:
    def tally(right: list[bool]) -> Tally:
        t = Tally()
        for r in right:  # one question per session
            t.answered("build", [Score(exact=r, normalised=r)], [])
        return t

    row = tally([True, False, True, True]).row(tally([True, True, True, True]))
    assert row["accuracy_vs_none"] == 0.75
    lo, hi = row["accuracy_vs_none_ci95"]
    assert lo <= 0.75 <= hi
    assert tally([True]).row(tally([False]))["accuracy_vs_none_ci95"] is None
    assert "accuracy_vs_none_ci95" not in tally([True]).row(None)


def test_parse_prefix_counters_sums_engines_and_skips_created_gauges() -> None:
    assert parse_prefix_counters(METRICS) == (1216.0, 3300.0)
    assert parse_prefix_counters("# nothing here\n") == (0.0, 0.0)


def test_prefix_cache_reads_every_engine_and_reports_a_refused_reset() -> None:
    resets: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=METRICS)
        resets.append(request.url.host)
        # the second server runs without VLLM_SERVER_DEV_MODE: no such route
        return httpx.Response(200 if request.url.host == "a" else 404)

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        cache = PrefixCache(client, ["http://a", "http://b"])
        assert cache.counters() == (2432.0, 6600.0)
        assert cache.reset() is False
        assert resets == ["a", "b"]


def test_extends_allows_the_generation_prompt_and_nothing_else() -> None:
    previous = list(range(100))
    grown = previous[: 100 - GENERATION_TAIL] + [7] * 50  # the next message where it was
    assert extends(previous, grown) == (True, 0.92)
    assert extends(previous, [*previous, 1, 2]) == (True, 1.0)
    rewritten = previous[:10] + [-1] * 80  # a new summary after the system prompt
    assert extends(previous, rewritten) == (False, 0.1)
    assert extends([], [1]) == (True, 0.0)
