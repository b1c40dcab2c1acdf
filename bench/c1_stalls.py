"""The agent body's slowest requests at concurrency 1, cell after cell (#29).

``bench.gateway_overhead`` runs one concurrency-1 cell per kind, so its ``max_stall_ms``
is one sample of a rare event. Here the operator configuration's gateway (API keys,
router, sandbox, recording to SQLite: ``bench.proxies.start_gearshift``) answers
``--cells`` cells of ``--requests`` agent-body requests (``bench.agent_body``: 30
messages, 39 KB) one at a time, non-streamed, and the bare mock upstream answers the same
cells first (the baseline, in the same run). Per cell: p50, p99 and the worst request;
the last line has them all and ``worst_over_upstream_ms``, the gateway's worst request
over the mock's worst, the median over cells.

    python -m bench.c1_stalls [--quick] [--cells N] [--requests N]

Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from bench.agent_body import agent_body
from bench.gateway_overhead import loadgen
from bench.procs import pinned, start, stop, wait_http
from bench.proxies import CLIENT_CORE, Target, free_port, start_gearshift


def cells(target: Target, body: Path, n: int, requests: int) -> list[dict[str, float]]:
    out = []
    for i in range(n):
        cell = loadgen(target, "plain", 1, requests, 120, ["--body", str(body)])
        row = {k: round(float(cell[k]), 2) for k in ("p50_ms", "p99_ms", "max_ms")}
        print(
            f"{target.name} cell {i}: p50 {row['p50_ms']} ms p99 {row['p99_ms']} ms "
            f"worst {row['max_ms']} ms",
            flush=True,
        )
        out.append(row)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="two cells of 100 requests")
    parser.add_argument("--cells", type=int, help="cells per target (default 5)")
    parser.add_argument("--requests", type=int, help="requests per cell (default 1,000)")
    args = parser.parse_args()
    n = args.cells or (2 if args.quick else 5)
    requests = args.requests or (100 if args.quick else 1000)
    if n < 1 or requests < 1:
        parser.error("--cells and --requests must be at least 1")
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-c1-") as tmpdir:
        tmp = Path(tmpdir)
        body = tmp / "agent.json"
        body.write_bytes(orjson.dumps(agent_body()))
        port, mock_log = free_port(), tmp / "mock.log"
        argv = [sys.executable, "-m", "bench.mock_upstream", "--port", str(port)]
        mock = start(pinned(argv, CLIENT_CORE), mock_log)
        gateway: Target | None = None
        try:
            wait_http(f"http://127.0.0.1:{port}/health", mock, mock_log)
            mock_url = f"http://127.0.0.1:{port}"
            upstream = cells(
                Target("upstream", mock_url + "/v1/chat/completions", "mock", None),
                body,
                n,
                requests,
            )
            gateway = start_gearshift(tmp, mock_url, "gearshift_op", operator=True)
            served = cells(gateway, body, n, requests)
        finally:
            if gateway is not None and gateway.proc is not None:
                stop(gateway.proc)
            stop(mock)
    over = [g["max_ms"] - u["max_ms"] for g, u in zip(served, upstream, strict=True)]
    result: dict[str, Any] = {
        "cells": n,
        "requests": requests,
        "gearshift_op": served,
        "upstream": upstream,
        "worst_ms": [c["max_ms"] for c in served],
        "worst_over_upstream_ms": round(statistics.median(over), 2),
        "p99_ms_median": round(statistics.median(c["p99_ms"] for c in served), 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
