"""This checkout's gateway against another revision's, side by side in one run.

A change worth a few percent of a request's CPU is below what separate runs of
``bench.gateway_overhead`` can show on a shared machine: the same code's CPU a request moves
by 10-25 % between runs. Here two operator gateways (``bench.proxies.start_gearshift``: API
keys, router, sandbox, recording to SQLite) run at once on the proxy core: ``head``, this
checkout, and ``base``, the revision ``--base`` names, checked out in a temporary git
worktree whose code the base gateway and its child processes (the recorder's writer, the
sandbox) run. Each round sends every kind of cell to both, in alternating order, so the
machine's drift falls on both alike: 1,000 non-streamed requests at concurrency 1 with the
chat body (2 messages) and with the agent body (30 messages, 39 KB), then 2,000 agent-body
requests at concurrency 64 (CPU a request and requests/s until the recorder has written
everything). Added p99 is the gateway's p99 less the bare mock's, measured first.

The base revision must take the configuration this checkout's ``bench.proxies`` writes, and
runs in this checkout's environment (its own dependencies are not installed).

    python -m bench.revisions --base REV [--quick] [--rounds N] [--requests N]

Last line: one JSON object: the medians over rounds per arm and kind, the ratios head /
base (``ratio_cpu_<kind>``, ``ratio_added_p99_ms_<kind>``, ``ratio_sustained_rps_agent_c64``)
and in how many rounds head's CPU a request was the lower (``head_lower_cpu_<kind>``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

from bench.agent_body import agent_body
from bench.procs import pinned, start, stop, wait_http
from bench.proxies import CLIENT_CORE, Target, free_port, start_gearshift
from bench.writer_priority import cell

ARMS = ("head", "base")
REPO = Path(__file__).resolve().parents[1]


def worktree(rev: str, where: Path) -> str:
    """Check ``rev`` out at ``where`` (detached); its full commit id."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(where), commit],
        check=True,
    )  # fmt: skip
    found = subprocess.run(  # as start_gearshift(code=...) starts it
        [sys.executable, "-c", "import gateway; print(gateway.__file__)"],
        check=True, capture_output=True, text=True, cwd=where,
        env={**os.environ, "PYTHONPATH": str(where)},
    ).stdout.strip()  # fmt: skip
    if not Path(found).resolve().is_relative_to(where.resolve()):
        raise RuntimeError(f"the base gateway would run {found}, not the worktree's code")
    return commit


def summarize(
    results: dict[str, dict[str, list[dict[str, float]]]], upstream: dict[str, float]
) -> dict[str, Any]:
    """Medians per arm and kind, the ratios head / base, and how often head was cheaper."""
    summary: dict[str, Any] = {}
    kinds = list(results["head"])
    for arm in ARMS:
        for kind in kinds:
            rows = results[arm][kind]
            med = {k: round(statistics.median(x[k] for x in rows), 3) for k in rows[0]}
            if kind in upstream:
                med["added_p99_ms"] = round(med["p99_ms"] - upstream[kind], 3)
            summary[f"{arm}_{kind}"] = med
    for kind in kinds:
        head, base = summary[f"head_{kind}"], summary[f"base_{kind}"]
        key = "added_p99_ms" if kind in upstream else "sustained_rps"
        summary[f"ratio_{key}_{kind}"] = round(head[key] / max(base[key], 1e-9), 3)
        summary[f"ratio_cpu_{kind}"] = round(
            head["cpu_ms_per_req"] / max(base["cpu_ms_per_req"], 1e-9), 3
        )
        summary[f"head_lower_cpu_{kind}"] = sum(
            h["cpu_ms_per_req"] < b["cpu_ms_per_req"]
            for h, b in zip(results["head"][kind], results["base"][kind], strict=True)
        )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the revision to compare with (git rev)")
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
        "chat_c1": (1, requests, False),
        "agent_c1": (1, requests, True),
        "agent_c64": (64, saturated, True),
    }
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-revisions-") as tmpdir:
        tmp = Path(tmpdir)
        code = tmp / "base-code"
        commit = worktree(args.base, code)
        body = tmp / "agent.json"
        body.write_bytes(orjson.dumps(agent_body()))
        loads = {k: ["--body", str(body)] if v[2] else [] for k, v in kinds.items()}
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
            for arm in ARMS:
                (tmp / arm).mkdir()
                gateways[arm] = start_gearshift(
                    tmp / arm, mock_url, f"gearshift_{arm}", operator=True,
                    code=code if arm == "base" else None,
                )  # fmt: skip
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
                            f"p99 {row['p99_ms']:7.2f} ms cpu {row['cpu_ms_per_req']:.3f} "
                            f"ms/req sustained {row['sustained_rps']:6.1f} req/s",
                            flush=True,
                        )
        finally:
            for target in gateways.values():
                if target.proc is not None:
                    stop(target.proc)
            stop(mock)
            subprocess.run(
                ["git", "-C", str(REPO), "worktree", "remove", "--force", str(code)],
                check=False,
            )  # fmt: skip
    summary = summarize(results, upstream)
    summary.update(base=commit, rounds=rounds, requests=requests, upstream_p99_ms=upstream)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
