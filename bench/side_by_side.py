"""Two operator gateways measured side by side in one run, for effects of a few percent.

Separate runs on a shared machine put the same code's CPU a request 10-25 % apart, so two
gateways (two settings, or two revisions) run at once on the proxy core and each round
sends every kind of cell to both, in alternating order: the machine's drift falls on both
alike. The kinds: 1,000 non-streamed requests at concurrency 1 with the chat body (2
messages) and with the agent body (30 messages, 39 KB), then 2,000 agent-body requests at
concurrency 64 (CPU a request, and requests/s until the recorder has written everything).
Added p99 is a gateway's p99 less the bare mock's, measured first in the same run.
Used by ``bench.writer_priority`` and ``bench.revisions``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from bench.agent_body import agent_body
from bench.gateway_overhead import loadgen
from bench.procs import pinned, start, stop, wait_http
from bench.proxies import CLIENT_CORE, Target, free_port

Results = dict[str, dict[str, list[dict[str, float]]]]  # arm -> kind -> a row per round
# start an arm's gateway: (its own directory, the mock's URL) -> the running gateway
Starter = Callable[[Path, str], Target]


def cell(target: Target, concurrency: int, requests: int, load: list[str]) -> dict[str, float]:
    out = loadgen(target, "plain", concurrency, requests, 300, load)
    if out["errors"]:
        raise RuntimeError(f"{target.name}: {out['errors']} requests failed")
    return {
        "p50_ms": out["p50_ms"], "p99_ms": out["p99_ms"], "max_ms": out["max_ms"],
        "cpu_ms_per_req": out["cpu_ms_per_req"], "sustained_rps": out["sustained_rps"],
        "gateway_minflt_per_req": out.get("gateway_minflt_per_req", float("nan")),
    }  # fmt: skip


Cells = dict[str, tuple[int, int, bool]]  # kind: (concurrency, requests, agent body?)


def parse(parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, int, Cells]:
    """``parser`` with the options every side-by-side benchmark takes, parsed: the arguments,
    the rounds and the cells they ask for."""
    parser.add_argument("--quick", action="store_true", help="one round of small cells")
    parser.add_argument("--rounds", type=int, help="rounds (default 5)")
    parser.add_argument("--requests", type=int, help="requests per c=1 cell (default 1,000)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 5)
    if rounds < 1 or (args.requests is not None and args.requests < 1):
        parser.error("--rounds and --requests must be at least 1")
    return args, rounds, kinds(args.quick, args.requests)


def kinds(quick: bool, requests: int | None) -> Cells:
    """name: (concurrency, requests, agent body?)"""
    n = requests or (100 if quick else 1000)
    return {
        "chat_c1": (1, n, False),
        "agent_c1": (1, n, True),
        "agent_c64": (64, 200 if quick else 2000, True),
    }


def run(
    tmp: Path, arms: dict[str, Starter], rounds: int, cells: Cells,
    after: Callable[[dict[str, Target]], None] | None = None,
) -> tuple[Results, dict[str, float]]:  # fmt: skip
    """Each round, every kind of cell to every arm, the order reversed every other round;
    the results and the bare mock's p99 by c=1 kind. ``after``: called with the gateways
    before they stop."""
    body = tmp / "agent.json"
    body.write_bytes(orjson.dumps(agent_body()))
    loads = {k: ["--body", str(body)] if v[2] else [] for k, v in cells.items()}
    port, mock_log = free_port(), tmp / "mock.log"
    mock = start(pinned([sys.executable, "-m", "bench.mock_upstream", "--port", str(port)],
                        CLIENT_CORE), mock_log)  # fmt: skip
    gateways: dict[str, Target] = {}
    try:
        wait_http(f"http://127.0.0.1:{port}/health", mock, mock_log)
        mock_url = f"http://127.0.0.1:{port}"
        bare = Target("upstream", mock_url + "/v1/chat/completions", "mock", None)
        upstream = {k: cell(bare, 1, v[1], loads[k])["p99_ms"] for k, v in cells.items()
                    if v[0] == 1}  # fmt: skip
        for arm, starter in arms.items():
            (tmp / arm).mkdir()
            gateways[arm] = starter(tmp / arm, mock_url)
            cell(gateways[arm], 4, 300, loads["agent_c1"])  # warm-up
        results: Results = {arm: {k: [] for k in cells} for arm in arms}
        for r in range(rounds):
            order = list(arms) if r % 2 == 0 else list(reversed(arms))
            for kind, (concurrency, n, _) in cells.items():
                for arm in order:
                    row = cell(gateways[arm], concurrency, n, loads[kind])
                    results[arm][kind].append(row)
                    print(
                        f"round {r} {kind:9} {arm:4}: p50 {row['p50_ms']:7.2f} ms "
                        f"p99 {row['p99_ms']:7.2f} ms max {row['max_ms']:7.2f} ms "
                        f"cpu {row['cpu_ms_per_req']:.3f} ms/req "
                        f"sustained {row['sustained_rps']:6.1f} req/s "
                        f"faults {row['gateway_minflt_per_req']:.1f}/req",
                        flush=True,
                    )
        if after is not None:
            after(gateways)
    finally:
        for target in gateways.values():
            if target.proc is not None:
                stop(target.proc)
        stop(mock)
    return results, upstream


def summarize(results: Results, upstream: dict[str, float], a: str, b: str) -> dict[str, Any]:
    """Medians per arm and kind (``<arm>_<kind>``), the ratios ``a`` / ``b``
    (``ratio_cpu_<kind>``, ``ratio_added_p99_ms_<c=1 kind>``,
    ``ratio_sustained_rps_<other kind>``), and in how many rounds ``a``'s CPU a request was
    the lower (``<a>_lower_cpu_<kind>``)."""
    summary: dict[str, Any] = {"upstream_p99_ms": upstream}
    for arm, by_kind in results.items():
        for kind, rows in by_kind.items():
            med = {k: round(statistics.median(x[k] for x in rows), 3) for k in rows[0]}
            if kind in upstream:
                med["added_p99_ms"] = round(med["p99_ms"] - upstream[kind], 3)
            summary[f"{arm}_{kind}"] = med
    for kind in results[a]:
        first, second = summary[f"{a}_{kind}"], summary[f"{b}_{kind}"]
        key = "added_p99_ms" if kind in upstream else "sustained_rps"
        summary[f"ratio_{key}_{kind}"] = round(first[key] / max(second[key], 1e-9), 3)
        summary[f"ratio_cpu_{kind}"] = round(
            first["cpu_ms_per_req"] / max(second["cpu_ms_per_req"], 1e-9), 3
        )
        summary[f"{a}_lower_cpu_{kind}"] = sum(
            x["cpu_ms_per_req"] < y["cpu_ms_per_req"]
            for x, y in zip(results[a][kind], results[b][kind], strict=True)
        )
    return summary
