"""What the slowest 1% of a probed gateway's concurrency-1 requests spent their time on.

Reads ``bench.stall_probe``'s ``request`` lines. A request that overlaps no other is a
concurrency-1 one (the load generator's warm-up and its 16/64 cells overlap). For the
non-streamed and the streamed ones apart: the p50/p99, and for the requests at or over
the p99 beside all of them, the mean of each part of a request's time (the loop
thread's CPU, its wait for a core, other threads' CPU holding the GIL, the collector,
the child processes' CPU), the share of the slow ones among the largest bodies, and
how many overlapped a background thread's run (the token estimate's refit, the control
plane's refresh).

    python -m bench.stall_tail PROBE.jsonl
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.loadgen import percentile as _p
from bench.stall_probe import THREAD_STAGES

PARTS = ("ms", "cpu_ms", "queued_ms", "threads_ms", "gc_ms", "children_ms", "blocked_ms")
# a session's 15 request sizes: its longest (30 messages) is the top fifteenth
LARGEST_SHARE = 1 / 15


def isolated(requests: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests whose span overlaps no other request's."""
    ordered = sorted(requests, key=lambda r: r["t"])
    out = []
    for i, r in enumerate(ordered):
        end = r["t"] + r["ms"] / 1000
        before = i > 0 and ordered[i - 1]["t"] + ordered[i - 1]["ms"] / 1000 > r["t"]
        after = i + 1 < len(ordered) and ordered[i + 1]["t"] < end
        if not before and not after:
            out.append(r)
    return out


def _overlaps(r: dict[str, Any], e: dict[str, Any]) -> bool:
    return e["t"] < r["t"] + r["ms"] / 1000 and e["t"] + e["ms"] / 1000 > r["t"]


def breakdown(requests: list[dict[str, Any]], others: list[dict[str, Any]]) -> dict[str, Any]:
    """The p50/p99 of ``requests`` and what their slowest 1% spent, beside all of them;
    ``others``: the probe's other events (background threads, collections, the writer)."""
    for r in requests:
        r["blocked_ms"] = r["ms"] - r["cpu_ms"] - r["queued_ms"]
    times = [r["ms"] for r in requests]
    p99 = _p(times, 0.99)
    slow = [r for r in requests if r["ms"] >= p99]
    largest = _p([r["bytes"] for r in requests], 1 - LARGEST_SHARE)
    big = [r["ms"] for r in requests if r["bytes"] >= largest]
    rest = [r["ms"] for r in requests if r["bytes"] < largest]
    during: dict[str, int] = {}
    for r in slow:
        for kind in {e.get("name", e["kind"]) for e in others if _overlaps(r, e)}:
            during[kind] = during.get(kind, 0) + 1
    return {
        "requests": len(requests),
        "p50_ms": round(_p(times, 0.5), 3),
        "p99_ms": round(p99, 3),
        "max_ms": round(max(times), 3),
        "slow_mean": {k: round(statistics.fmean(r[k] for r in slow), 3) for k in PARTS},
        "all_mean": {k: round(statistics.fmean(r[k] for r in requests), 3) for k in PARTS},
        "slow_among_largest": sum(r["bytes"] >= largest for r in slow),
        "p99_ms_largest": round(_p(big, 0.99), 3),
        "p99_ms_others": round(_p(rest, 0.99), 3),
        "slow_during": during,
    }


def tail(events: list[dict[str, Any]]) -> dict[str, Any]:
    """``breakdown`` of the concurrency-1 requests, non-streamed and streamed apart."""
    alone = isolated([e for e in events if e["kind"] == "request"])
    others = [e for e in events if e["kind"] in ("call", "gc", "writer", "lag")]
    others = [e for e in others if e["kind"] != "call" or e["name"] in THREAD_STAGES]
    out = {}
    for mode, streamed in (("plain", False), ("stream", True)):
        chosen = [r for r in alone if r.get("stream", False) is streamed]
        if chosen:
            out[mode] = breakdown(chosen, others)
    return out


def show(result: dict[str, Any]) -> None:
    for mode, b in result.items():
        print(
            f"tail: {mode} c=1, {b['requests']} requests, p50 {b['p50_ms']} ms, p99 "
            f"{b['p99_ms']} ms (largest bodies {b['p99_ms_largest']}, others "
            f"{b['p99_ms_others']}), {b['slow_among_largest']} of the slowest 1% among "
            "the largest bodies"
        )
        for name, parts in (("slowest 1%", b["slow_mean"]), ("all", b["all_mean"])):
            print(f"  {name:10s} mean " + ", ".join(f"{k} {v}" for k, v in parts.items()))
        print(f"  the slowest 1% during: {b['slow_during'] or 'nothing logged'}")


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    events = [json.loads(x) for x in Path(sys.argv[1]).read_text().splitlines() if x.strip()]
    result = tail(events)
    show(result)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
