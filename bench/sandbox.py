"""Sandbox start-up and throughput: the bare runtime against plain ``subprocess``, and the
tool calls an agent makes through the gateway, in one run.

The bare runtime (what earlier runs measured, in this process):

- cold: one sandboxed run per call (cgroup, seccomp filter, bubblewrap namespaces) of
  ``/bin/true``, ``python3 -c 'print(1)'`` and ``sh -c 'echo 1'``, p50/p99, next to the same
  commands run with ``asyncio.create_subprocess_exec`` and no isolation;
- warm: repeated ``run_python`` calls in one session through ``Sandbox.call`` (policy,
  faults, attestation included), after an untimed first that starts its interpreter;
- throughput: warm tool calls per second over 4 sessions, one call in flight each.

Through the API (bench.sandbox_api: a ``gearshift serve`` on 127.0.0.1 with the sandbox it
starts, API keys, policy, attestation and recording to SQLite): ``POST /v1/tools/run_python``
(``print(1)``) and ``/v1/tools/run_shell`` (``echo 1``), each answering a tool call of a
recorded step, p50/p95:

- cold: each call the first of a new session, 0.3 s apart (an agent's first tool call
  comes after a chat step at least: the sandbox's pool of spare warm sandboxes refills
  in the meantime); ``cold_burst``: the same back to back, outrunning the refill;
- warm: calls in one session after a first;
- load: warm calls over 1, 2, 4, 8, 16 sessions, one call in flight each: calls/s, latency, and
  the CPU the gateway's process tree and this client used per second of the cell, and per
  call that of the tree, the gateway's own process and the sandbox service.

    python -m bench.sandbox [--quick] [--pool N]

Needs root and bubblewrap, like the service. Progress goes to stderr; the last line printed
is one JSON object: the bare runtime's keys of earlier runs (``cold_*``, ``plain_*``,
``warm_*``, ``calls_per_s``), then ``api_cold_p50_ms``, ``api_cold_burst_p50_ms`` and
``api_warm_p50_ms`` (run_python), ``api_calls_per_s`` (warm run_python, the best concurrency), the same for
run_shell (``api_shell_*``), the ratios of the API to the bare runtime
(``*_ratio_vs_bare``, see ``ratios``), ``api_errors``, and every cell (``api_cells``,
``api_load``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from pydantic import SecretStr

from bench import sandbox_api as api
from sandbox.config import GrantConfig, Resources, SandboxConfig
from sandbox.core import Sandbox
from sandbox.policy import ResourceClass
from sandbox.protocol import Principal, SessionCreate, ToolCall
from sandbox.runtime.bwrap import BwrapRuntime
from sandbox.runtime.gvisor import RunscRuntime
from sandbox.workspace import sweep

WHO = Principal(tenant="bench", key="k")
BARE = (
    ("true", ["/bin/true"]),
    ("python", ["/usr/bin/python3", "-c", "print(1)"]),
    ("shell", ["/bin/sh", "-c", "echo 1"]),
)
Result = dict[str, float]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def progress(message: str) -> None:
    print(f"[bench.sandbox {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


async def timed(n: int, fn: Callable[[], Awaitable[object]]) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await fn()
        out.append((time.perf_counter() - t) * 1000)
    return out


async def plain(argv: list[str]) -> None:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    await proc.communicate()


async def bare_cold(ws: Path, n: int, result: Result) -> None:
    rt, limits = BwrapRuntime(), ResourceClass()
    for name, argv in BARE:
        progress(f"bare runtime: {n} cold runs of {' '.join(argv)}, and as plain subprocesses")
        base = await timed(n, lambda a=argv: plain(a))  # type: ignore[misc]
        cold = await timed(n, lambda a=argv: rt.run(a, ws, limits))  # type: ignore[misc]
        result[f"cold_{name}_p50_ms"] = round(statistics.median(cold), 2)
        result[f"cold_{name}_p99_ms"] = round(pct(cold, 0.99), 2)
        result[f"plain_{name}_p50_ms"] = round(statistics.median(base), 2)
        print(f"bare {name:6s} sandboxed p50 {statistics.median(cold):6.1f} ms p99 {pct(cold, 0.99):6.1f} ms"
              f" | plain subprocess p50 {statistics.median(base):5.1f} ms", flush=True)  # fmt: skip
    progress("bare runtime: gVisor cold runs")
    gv = RunscRuntime()
    gvisor = await timed(max(5, n // 10), lambda: gv.run(["/bin/true"], ws, limits))
    result["cold_gvisor_true_p50_ms"] = round(statistics.median(gvisor), 1)
    print(f"bare gVisor /bin/true p50 {statistics.median(gvisor):6.1f} ms", flush=True)


async def bare_warm(root: Path, n: int, total: int, result: Result) -> None:
    progress(f"bare runtime: {n} warm run_python calls in one session, {total} over 4 sessions")
    config = SandboxConfig(
        token=SecretStr("bench"), root=root,
        grants_by_tenant={"bench": GrantConfig(tools=["run_python"], resources=Resources())},
    )  # fmt: skip
    sandbox = Sandbox(config)
    sid = sandbox.create(SessionCreate(principal=WHO)).id
    call = ToolCall(principal=WHO, session_id=sid, arguments={"code": "print(1)"})
    await sandbox.call("run_python", call)  # its resident interpreter
    warm = await timed(n, lambda: sandbox.call("run_python", call))
    result["warm_p50_ms"] = round(statistics.median(warm), 2)
    result["warm_p99_ms"] = round(pct(warm, 0.99), 2)
    # Four sessions, one call in flight each: calls within a session run one at a time.
    sids = [sandbox.create(SessionCreate(principal=WHO)).id for _ in range(4)]
    calls = [ToolCall(principal=WHO, session_id=x, arguments={"code": "print(1)"}) for x in sids]
    for c in calls:  # start their interpreters
        await sandbox.call("run_python", c)
    started = time.perf_counter()

    async def worker(c: ToolCall) -> None:
        for _ in range(total // 4):
            await sandbox.call("run_python", c)

    await asyncio.gather(*(worker(c) for c in calls))
    result["calls_per_s"] = round(total / (time.perf_counter() - started), 1)
    print(f"bare warm run_python p50 {result['warm_p50_ms']} ms p99 {result['warm_p99_ms']} ms;"
          f" {result['calls_per_s']} calls/s over 4 sessions", flush=True)  # fmt: skip
    for x in [sid, *sids]:
        await sandbox.remove(x)


async def bare_runtime(quick: bool) -> Result:
    n = 30 if quick else 150
    root = Path(tempfile.mkdtemp(prefix="gearshift-sbx-bench-"))
    os.chmod(root, 0o711)
    ws = root / "ws"
    ws.mkdir()
    os.chown(ws, 65534, 65534)
    result: Result = {}
    try:
        await bare_cold(ws, n, result)
        await bare_warm(root, n, 60 if quick else 300, result)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["cold_p50_ms"] = result["cold_true_p50_ms"]
    return result


Cell = dict[str, float]  # p50_ms, p95_ms, errors; a load cell adds calls/s and CPU


@dataclass
class ApiFigures:
    latency: dict[str, Cell] = field(default_factory=dict)  # "run_python/cold", ...
    load: dict[str, dict[int, Cell]] = field(default_factory=dict)  # tool, concurrency
    error_kinds: dict[str, int] = field(default_factory=dict)  # failed calls by kind

    def best_calls_per_s(self, tool: str) -> float:
        return max(c["calls_per_s"] for c in self.load[tool].values())

    def errors(self) -> int:
        cells = [*self.latency.values(), *(c for t in self.load.values() for c in t.values())]
        return int(sum(c["errors"] for c in cells))


def _cell(label: str, ms: list[float], errors: int, run_ms: list[float]) -> Cell:
    """A cell's latencies; ``run_ms``: the runs' own durations (the rest is the service,
    the gateway, recording and HTTP)."""
    if not ms:
        raise RuntimeError(f"every {label} call failed")
    p50, p95, run = statistics.median(ms), pct(ms, 0.95), statistics.median(run_ms or [0.0])
    print(f"api  {label:28s} {len(ms):4d} calls p50 {p50:6.1f} ms p95 {p95:6.1f} ms"
          f" (the run itself p50 {run:5.1f} ms) errors {errors}", flush=True)  # fmt: skip
    return {"p50_ms": round(p50, 2), "p95_ms": round(p95, 2), "run_p50_ms": round(run, 2),
            "errors": errors}  # fmt: skip


async def _load_cell(agent: api.Agent, tool: str, c: int, total: int) -> Cell:
    progress(f"API: {total} warm {tool} calls over {c} sessions, one in flight each")
    before, runs = agent.errors, len(agent.run_ms)
    r = await api.load(agent, tool, c, total)
    cell = _cell(f"{tool} load c={c}", r.latencies_ms, agent.errors - before, agent.run_ms[runs:])
    print(f"     {'':28s} {r.calls_per_s:7.1f} calls/s; gateway tree {r.server_cpu_ms_per_call:5.1f}"
          f" CPU-ms/call (gateway {r.gateway_cpu_ms_per_call:4.2f}, sandbox service"
          f" {r.sandbox_cpu_ms_per_call:4.2f}), {r.server_cores:4.2f} cores;"
          f" client {r.client_cores:4.2f} cores", flush=True)  # fmt: skip
    return cell | {
        "calls_per_s": round(r.calls_per_s, 1),
        "server_cpu_ms_per_call": round(r.server_cpu_ms_per_call, 2),
        "gateway_cpu_ms_per_call": round(r.gateway_cpu_ms_per_call, 2),
        "sandbox_cpu_ms_per_call": round(r.sandbox_cpu_ms_per_call, 2),
        "server_cores": round(r.server_cores, 2),
        "client_cores": round(r.client_cores, 2),
    }


COLD_GAP_S = 0.3  # between an agent's new sessions: the pool refills in the meantime


async def api_cells(agent: api.Agent, quick: bool) -> ApiFigures:
    n, n_cold, total = (10, 6, 24) if quick else (150, 60, 240)
    concurrencies = (1, 4) if quick else (1, 2, 4, 8, 16)
    figures = ApiFigures()
    for tool in api.TOOLS:
        cells: list[tuple[str, int, Awaitable[list[float]], str]] = [
            ("cold", n_cold, api.cold(agent, tool, n_cold, COLD_GAP_S),
             f"a new session each, {COLD_GAP_S} s apart"),
            ("cold_burst", n_cold, api.cold(agent, tool, n_cold),
             "a new session each, back to back"),
            ("warm", n, api.warm(agent, tool, n), "one session"),
        ]  # fmt: skip
        for kind, count, run, what in cells:
            progress(f"API: {count} {kind} {tool} calls ({what})")
            before, runs = agent.errors, len(agent.run_ms)
            ms = await run
            label = f"{tool} {kind} ({what})"
            figures.latency[f"{tool}/{kind}"] = _cell(
                label, ms, agent.errors - before, agent.run_ms[runs:]
            )
        figures.load[tool] = {c: await _load_cell(agent, tool, c, total) for c in concurrencies}
    return figures


async def through_api(quick: bool, pool: int | None = None) -> ApiFigures:
    with tempfile.TemporaryDirectory(prefix="gearshift-sbx-api-") as tmp:
        async with api.tool_upstream() as upstream:
            progress("API: starting gearshift serve (keys, recording to SQLite, sandbox)")
            async with api.gateway(Path(tmp), upstream, pool=pool) as gw:
                connector = aiohttp.TCPConnector(limit=64)
                async with aiohttp.ClientSession(connector=connector) as http:
                    agent = api.Agent(http, gw)
                    figures = await api_cells(agent, quick)
        left = sweep(Path(tmp) / "workspaces")  # the service unmounts them as it stops
        if left:
            progress(f"API: {left} workspaces were still mounted after the gateway stopped")
        if agent.errors:
            progress(f"API: {agent.errors} calls failed; the first:\n{agent.first_error}")
        figures.error_kinds = dict(agent.error_kinds)
        return figures


def ratios(bare: dict[str, float], api_: ApiFigures) -> dict[str, float]:
    """The API's figures and their ratios to the bare runtime's: cold run_python to a cold
    ``python3 -c``; warm run_python to ``Sandbox.call`` in process; calls/s over 4 sessions
    to the bare runtime's 4 sessions; warm run_shell to a cold ``sh -c`` run."""
    lat = api_.latency
    out = {
        "api_cold_p50_ms": lat["run_python/cold"]["p50_ms"],
        "api_cold_p95_ms": lat["run_python/cold"]["p95_ms"],
        "api_warm_p50_ms": lat["run_python/warm"]["p50_ms"],
        "api_warm_p95_ms": lat["run_python/warm"]["p95_ms"],
        "api_calls_per_s": api_.best_calls_per_s("run_python"),
        "api_cold_burst_p50_ms": lat["run_python/cold_burst"]["p50_ms"],
        "api_shell_cold_p50_ms": lat["run_shell/cold"]["p50_ms"],
        "api_shell_warm_p50_ms": lat["run_shell/warm"]["p50_ms"],
        "api_shell_calls_per_s": api_.best_calls_per_s("run_shell"),
    }
    four = api_.load["run_python"][4]["calls_per_s"]
    return out | {
        "api_cold_ratio_vs_bare": round(out["api_cold_p50_ms"] / bare["cold_python_p50_ms"], 2),
        "api_warm_ratio_vs_bare": round(out["api_warm_p50_ms"] / bare["warm_p50_ms"], 2),
        "api_calls_per_s_ratio_vs_bare": round(four / bare["calls_per_s"], 2),
        "api_shell_ratio_vs_bare": round(
            out["api_shell_warm_p50_ms"] / bare["cold_shell_p50_ms"], 2
        ),
    }


async def main_async(quick: bool, pool: int | None = None) -> dict[str, object]:
    bare = await bare_runtime(quick)
    figures = await through_api(quick, pool)
    return {
        **bare,
        **ratios(bare, figures),
        "api_errors": figures.errors(),
        "api_error_kinds": figures.error_kinds,
        "api_cells": figures.latency,
        "api_load": figures.load,
        "targets": {"api_cold_p50_ms": 40, "api_warm_p50_ms": 5, "api_calls_per_s": 100},
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="fewer calls per cell (seconds)")
    p.add_argument(
        "--pool", type=int, default=None,
        help="sandbox.pool for the gateway's sandbox (default: the configuration's default; "
        "0: no spare warm sandboxes, to compare)",
    )  # fmt: skip
    a = p.parse_args()
    print(json.dumps(asyncio.run(main_async(a.quick, a.pool))))


if __name__ == "__main__":
    main()
