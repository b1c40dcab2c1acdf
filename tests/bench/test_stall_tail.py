from bench import stall_tail


def request(t: float, ms: float, size: int = 1000, stream: bool = False, **parts: float) -> dict:
    base = {"cpu_ms": 1.0, "queued_ms": 0.0, "threads_ms": 0.0, "gc_ms": 0.0, "children_ms": 0.0}
    return {"kind": "request", "t": t, "ms": ms, "bytes": size, "stream": stream,
            **base, **parts}  # fmt: skip


def test_only_requests_that_overlap_no_other_count_as_concurrency_one():
    a, b, c = request(10.0, 5.0), request(10.002, 5.0), request(11.0, 5.0)
    assert stall_tail.isolated([c, b, a]) == [c]


def test_the_slowest_percent_is_set_beside_the_rest_with_what_ran_during_it():
    events = [request(i * 0.1, 2.0, size=1000 + i) for i in range(100)]
    # the slowest two: one waited on a thread holding the GIL, one on a core
    events.append(request(30.0, 9.0, size=5000, threads_ms=6.0))
    events.append(request(31.0, 8.0, size=500, queued_ms=5.0))
    events.append(request(40.0, 30.0, stream=True))
    events.append({"kind": "call", "t": 30.001, "ms": 6.0, "name": "refit_from_traffic"})
    events.append({"kind": "call", "t": 31.001, "ms": 6.0, "name": "RouteStage.__call__"})
    out = stall_tail.tail(events)
    plain = out["plain"]
    assert plain["requests"] == 102 and plain["p50_ms"] == 2.0 and plain["p99_ms"] == 8.0
    assert plain["slow_mean"]["threads_ms"] == 3.0 and plain["slow_mean"]["queued_ms"] == 2.5
    assert plain["slow_mean"]["blocked_ms"] == 5.0  # (9 - 1) and (8 - 1 - 5)
    assert plain["slow_among_largest"] == 1  # the 9 ms one; the 8 ms one is small
    assert plain["slow_during"] == {"refit_from_traffic": 1}  # a loop stage is not a thread
    assert out["stream"]["requests"] == 1 and out["stream"]["max_ms"] == 30.0
