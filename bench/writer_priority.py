"""The recorder's writer at idle priority against niceness 10, on the gateway's core (#29).

Two operator gateways (``bench.proxies.start_gearshift``: API keys, router, sandbox,
recording to SQLite), both pinned to the proxy core with their writers: ``idle``, the
default (``store.writer_idle: true``: the writer at ``SCHED_IDLE`` while it is served),
and ``nice`` (``writer_idle: false``: the writer at niceness 10, as before). Each round
sends every kind of cell to both, in alternating order, so the machine's drift falls on
both alike: concurrency 1 (non-streamed; what the user of a quiet gateway waits for, and
the p99 the issue's target is about) for the chat body (2 messages) and the agent body
(30 messages, 39 KB), and concurrency 64 with the agent body (the writer's share of a
saturated core: CPU a request and requests/s until the recorder has written everything;
there the idle writer starves and is brought back to niceness 10 for a cool-down, counted
in ``idle_writer_rescues``).
The bare mock's p99 at concurrency 1 is measured first, in the same run, and subtracted
(``added_p99_ms``, as ``bench.gateway_overhead`` does).

    python -m bench.writer_priority [--quick] [--rounds N] [--requests N]

Last line: one JSON object with the medians over rounds and the ratios idle / nice.
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
from bench.proxies import CLIENT_CORE, Target, free_port, metric_sum, start_gearshift

ARMS = {"idle": "", "nice": "writer_idle: false"}


def cell(target: Target, concurrency: int, requests: int, load: list[str]) -> dict[str, float]:
    out = loadgen(target, "plain", concurrency, requests, 300, load)
    if out["errors"]:
        raise RuntimeError(f"{target.name}: {out['errors']} requests failed")
    return {
        "p50_ms": out["p50_ms"], "p99_ms": out["p99_ms"], "max_ms": out["max_ms"],
        "cpu_ms_per_req": out["cpu_ms_per_req"], "sustained_rps": out["sustained_rps"],
    }  # fmt: skip


def starved(target: Target) -> float:
    """How often the gateway's recorder brought its starved writer back from idle
    priority (``gearshift_recorder_writer_starved_total``)."""
    assert target.metrics is not None
    return metric_sum(target.metrics, ("gearshift_recorder_writer_starved_total",))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one round of small cells")
    parser.add_argument("--rounds", type=int, help="rounds (default 5)")
    parser.add_argument("--requests", type=int, help="requests per c=1 cell (default 1,000)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 5)
    requests = args.requests or (100 if args.quick else 1000)
    saturated = 200 if args.quick else 2000
    if rounds < 1 or requests < 1:
        parser.error("--rounds and --requests must be at least 1")
    kinds = {  # name: (concurrency, requests, bench.loadgen's body arguments)
        "chat_c1": (1, requests, []),
        "agent_c1": (1, requests, ["--body"]),
        "agent_c64": (64, saturated, ["--body"]),
    }
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-writer-") as tmpdir:
        tmp = Path(tmpdir)
        body = tmp / "agent.json"
        body.write_bytes(orjson.dumps(agent_body()))
        loads = {k: [*v[2], str(body)] if v[2] else [] for k, v in kinds.items()}
        port, mock_log = free_port(), tmp / "mock.log"
        mock = start(pinned([sys.executable, "-m", "bench.mock_upstream", "--port", str(port)],
                            CLIENT_CORE), mock_log)  # fmt: skip
        gateways: dict[str, Target] = {}
        try:
            wait_http(f"http://127.0.0.1:{port}/health", mock, mock_log)
            mock_url = f"http://127.0.0.1:{port}"
            bare = Target("upstream", mock_url + "/v1/chat/completions", "mock", None)
            upstream = {
                k: cell(bare, 1, requests, loads[k])["p99_ms"] for k in ("chat_c1", "agent_c1")
            }
            for arm, options in ARMS.items():
                (tmp / arm).mkdir()
                gateways[arm] = start_gearshift(
                    tmp / arm, mock_url, f"gearshift_{arm}", operator=True, store_options=options
                )
                cell(gateways[arm], 4, 300, loads["agent_c1"])  # warm-up
            results: dict[str, dict[str, list[dict[str, float]]]] = {
                arm: {k: [] for k in kinds} for arm in ARMS
            }
            for r in range(rounds):
                order = list(ARMS) if r % 2 == 0 else list(reversed(ARMS))
                for kind, (concurrency, n, _) in kinds.items():
                    for arm in order:
                        row = cell(gateways[arm], concurrency, n, loads[kind])
                        results[arm][kind].append(row)
                        print(
                            f"round {r} {kind:9} {arm:4}: p50 {row['p50_ms']:7.2f} ms "
                            f"p99 {row['p99_ms']:7.2f} ms max {row['max_ms']:7.2f} ms "
                            f"cpu {row['cpu_ms_per_req']:.3f} ms/req "
                            f"sustained {row['sustained_rps']:6.1f} req/s",
                            flush=True,
                        )
            rescues = starved(gateways["idle"])
        finally:
            for target in gateways.values():
                if target.proc is not None:
                    stop(target.proc)
            stop(mock)
    summary: dict[str, Any] = {
        "rounds": rounds, "requests": requests, "upstream_p99_ms": upstream,
        "idle_writer_rescues": rescues,
    }  # fmt: skip
    for arm in ARMS:
        for kind in kinds:
            rows = results[arm][kind]
            med = {k: round(statistics.median(x[k] for x in rows), 3) for k in rows[0]}
            if kind in upstream:
                med["added_p99_ms"] = round(med["p99_ms"] - upstream[kind], 3)
            summary[f"{arm}_{kind}"] = med
    for kind in kinds:
        idle, nice = summary[f"idle_{kind}"], summary[f"nice_{kind}"]
        key = "added_p99_ms" if kind in upstream else "sustained_rps"
        summary[f"ratio_{key}_{kind}"] = round(idle[key] / max(nice[key], 1e-9), 3)
        summary[f"ratio_cpu_{kind}"] = round(
            idle["cpu_ms_per_req"] / max(nice["cpu_ms_per_req"], 1e-9), 3
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
