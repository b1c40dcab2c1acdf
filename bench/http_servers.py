"""Uvicorn or granian under the gateway: CPU per request and added latency, A/B in one run.

Two gateways as operators run them (bench.proxies ``gearshift_config``: API keys, the
default router, recording to SQLite, the sandbox enabled), one served by uvicorn (the
default) and one by granian's embedded server (``GEARSHIFT_HTTP_SERVER=granian``,
gateway/cli/serve.py), each with its own sandbox root (whether each started: the JSON's
``sandbox``), both pinned to the proxy core, answer one mock upstream (bench.mock_upstream).
First the same agent-session requests go to both, and each answer's
status and body (its ``id`` and ``created`` left out) must be the same. Then, round by round,
each cell (agent sessions, bench.loadgen ``--sessions``: non-stream at c=1 and c=16, stream
at c=16) runs on the bare upstream, then on the two gateways in alternating order, the
recorder's writer drained after each (bench.proxies ``drain``). Per cell and round it prints
CPU-ms a request of the gateway process alone and of its whole tree (the writer and sandbox
too), p50/p99, and the gateway's added p50/p99 (minus the upstream's in the same round).

    python -m bench.http_servers [--quick] [--rounds N]

The last line printed is one JSON object: per cell the medians over rounds, and
``cpu_ratio_granian_vs_uvicorn``: the median over rounds of granian's CPU a request over
uvicorn's in the same round (gateway process, non-stream c=16; ``_tree``: the tree's).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import statistics
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any
from unittest.mock import patch

import orjson

from bench import gateway_overhead as overhead
from bench.agent_body import session_bodies
from bench.procs import pinned, process_cpu_seconds, start, stop, wait_http
from bench.proxies import CLIENT_CORE, Target, free_port, sandbox_state, start_gearshift

SERVERS = ("uvicorn", "granian")
CELLS = (("plain", 1), ("plain", 16), ("stream", 16))
VOLATILE = re.compile(rb'"(id|created)":("[^"]*"|\d+)')


def cell_size(concurrency: int, quick: bool) -> tuple[int, float]:
    """Requests and time limit of one cell."""
    if quick:
        return (30, 10) if concurrency == 1 else (64, 10)
    return (400, 40) if concurrency == 1 else (1500, 40)


def answer_digest(target: Target, sessions: int, stream: bool) -> tuple[str, list[int]]:
    """The digest of the target's answers to ``sessions`` agent sessions (each answer's status
    and body, ``id`` and ``created`` masked), and the statuses."""
    digest, statuses = hashlib.sha256(), []
    for seed in range(sessions):
        for step in session_bodies(seed):
            body = orjson.dumps({**step, "model": target.model, "stream": stream})
            req = urllib.request.Request(target.url, body, method="POST")
            req.add_header("content-type", "application/json")
            req.add_header("authorization", f"Bearer {target.key}")
            req.add_header("x-session-id", f"check-{int(stream)}-{seed}")
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    status, answer = resp.status, resp.read()
            except urllib.error.HTTPError as exc:
                status, answer = exc.code, exc.read()
            statuses.append(status)
            digest.update(b"%d %s\n" % (status, VOLATILE.sub(rb'"\1":_', answer)))
    return digest.hexdigest(), statuses


def loadgen(target: Target, mode: str, concurrency: int, quick: bool) -> dict[str, Any]:
    """One cell of agent sessions (bench.gateway_overhead's, whose CPU is the process
    tree's: ``tree_cpu_ms``), plus the CPU of the gateway process alone: ``cpu_ms``."""
    proc = target.proc
    own0 = process_cpu_seconds(proc.pid) if proc else 0.0
    result = overhead.loadgen(target, mode, concurrency, *cell_size(concurrency, quick),
                              ("--sessions",))  # fmt: skip
    own1 = process_cpu_seconds(proc.pid) if proc else 0.0
    done = max(1.0, result["completed"])
    result["cpu_ms"] = (own1 - own0) * 1000 / done if proc else float("nan")
    result["tree_cpu_ms"] = result["cpu_ms_per_req"]
    return result


def order(round_no: int) -> tuple[str, ...]:
    """The servers in a round's order: alternating, so neither always goes first."""
    return SERVERS if round_no % 2 == 0 else SERVERS[::-1]


def _key(mode: str, c: int) -> str:
    return f"{mode}_c{c}"


def measure(
    gateways: dict[str, Target], upstream: Target, rounds: int, quick: bool
) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Per cell key, per server (and ``upstream``), the rounds' results."""
    out: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for r in range(rounds):
        for mode, c in CELLS:
            key = _key(mode, c)
            base = loadgen(upstream, mode, c, quick)
            out.setdefault(key, {}).setdefault("upstream", []).append(base)
            for name in order(r):
                res = loadgen(gateways[name], mode, c, quick)
                res["added_p50_ms"] = res["p50_ms"] - base["p50_ms"]
                res["added_p99_ms"] = res["p99_ms"] - base["p99_ms"]
                out[key].setdefault(name, []).append(res)
                print(
                    f"round {r + 1} {key:9s} {name:8s} {res['completed']:5.0f} req "
                    f"{res['rps']:7.1f} req/s cpu {res['cpu_ms']:6.3f} ms/req "
                    f"(tree {res['tree_cpu_ms']:6.3f}) p50 {res['p50_ms']:7.2f} "
                    f"p99 {res['p99_ms']:7.2f} added p50 {res['added_p50_ms']:+6.2f} "
                    f"p99 {res['added_p99_ms']:+7.2f} ms errors {res['errors']:.0f}",
                    flush=True,
                )
    return out


def _median(rows: list[dict[str, Any]], field: str) -> float:
    return round(float(statistics.median(r[field] for r in rows)), 3)


def summarize(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    fields = ("cpu_ms", "tree_cpu_ms", "p50_ms", "p99_ms", "added_p50_ms", "added_p99_ms", "rps")
    cells = {
        key: {name: {f: _median(by_server[name], f) for f in fields} for name in SERVERS}
        for key, by_server in results.items()
    }
    for key, by_server in results.items():
        cells[key]["cpu_ratio_by_round"] = [  # type: ignore[assignment]
            round(g["cpu_ms"] / u["cpu_ms"], 3)
            for u, g in zip(by_server["uvicorn"], by_server["granian"], strict=True)
        ]
        cells[key]["cpu_ratio"] = _paired_ratio(by_server, "cpu_ms")  # type: ignore[assignment]
    sat = results[_key("plain", 16)]
    return {
        "cells": cells,
        "errors": {
            name: sum(r["errors"] for by in results.values() for r in by[name]) for name in SERVERS
        },
        "cpu_ratio_granian_vs_uvicorn": _paired_ratio(sat, "cpu_ms"),
        "cpu_ratio_granian_vs_uvicorn_tree": _paired_ratio(sat, "tree_cpu_ms"),
    }


def _paired_ratio(by_server: dict[str, list[dict[str, Any]]], field: str) -> float:
    """The median over rounds of granian's figure over uvicorn's in the same round."""
    pairs = zip(by_server["uvicorn"], by_server["granian"], strict=True)
    return round(float(statistics.median(g[field] / u[field] for u, g in pairs)), 3)


def run(tmp: Path, rounds: int, quick: bool) -> dict[str, Any]:
    mock_port, mock_log = free_port(), tmp / "mock.log"
    argv = [sys.executable, "-m", "bench.mock_upstream", "--port", str(mock_port)]
    mock = start(pinned(argv, CLIENT_CORE), mock_log)
    gateways: dict[str, Target] = {}
    try:
        wait_http(f"http://127.0.0.1:{mock_port}/health", mock, mock_log)
        mock_url = f"http://127.0.0.1:{mock_port}"
        for name in SERVERS:  # each its own sandbox root: a root serves one sandbox at a time
            root = str(tmp / name / "sandbox-root")
            env = {"GEARSHIFT_HTTP_SERVER": name, "GEARSHIFT_SANDBOX__ROOT": root}
            with patch.dict(os.environ, env):
                gateways[name] = start_gearshift(tmp / name, mock_url, name, operator=True)
        upstream = Target("upstream", mock_url + "/v1/chat/completions", "mock", None)
        answers: dict[str, Any] = {}
        for stream in (False, True):
            digests = {n: answer_digest(t, 2 if quick else 4, stream) for n, t in gateways.items()}
            label = "stream" if stream else "plain"
            answers[label] = {n: d for n, (d, _) in digests.items()}
            answers[f"{label}_statuses"] = sorted({s for _, ss in digests.values() for s in ss})
        same = all(len(set(answers[m].values())) == 1 for m in ("plain", "stream"))
        print(f"answers: {json.dumps(answers)} same: {same}", flush=True)
        if not same:
            raise RuntimeError(f"the two servers answered differently: {answers}")
        for t in gateways.values():  # warm-up: connections, caches, lazy imports
            loadgen(t, "plain", 8, True)
            loadgen(t, "stream", 8, True)
        summary = summarize(measure(gateways, upstream, rounds, quick))
        summary["answers_same"] = same
        summary["answer_statuses"] = answers["plain_statuses"] + answers["stream_statuses"]
        summary["rounds"] = rounds
        summary["sandbox"] = {name: sandbox_state(t) for name, t in gateways.items()}
        summary["granian"] = _granian_version()
        return summary
    finally:
        for t in gateways.values():
            if t.proc is not None:
                stop(t.proc)
        stop(mock)


def _granian_version() -> str:
    from importlib.metadata import version

    return version("granian")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="few requests per cell")
    parser.add_argument("--rounds", type=int, help="rounds of every cell (default 5; quick 2)")
    args = parser.parse_args()
    rounds = args.rounds or (2 if args.quick else 5)
    with tempfile.TemporaryDirectory(prefix="gearshift-http-") as tmpdir:
        tmp = Path(tmpdir)
        for name in SERVERS:
            (tmp / name).mkdir()
        summary = run(tmp, rounds, args.quick)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
