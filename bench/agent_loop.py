"""The hosted agent loop's own cost: gateway time per loop iteration, model and tool time
excluded, and the read cost of a long ``previous_response_id`` chain.

Setup: ``gearshift serve`` on 127.0.0.1 as bench.sandbox_api starts it (API keys, the
default router, recording to SQLite, the real sandbox service with a ``run_python`` grant),
its tiers on bench.loop_upstream in a process of its own: a model that calls ``run_python``
(``print(1)``) for the first N steps of a task and then answers with text, at once.

**Iteration overhead.** One task is one response: ``POST /v1/responses`` with a
``code_interpreter`` tool, N = ``--steps`` tool steps, so N + 1 model steps (an iteration
is one model step and the hosted calls it makes). Baseline, in the same run: the same task
driven by the client through ``POST /v1/chat/completions`` and ``POST /v1/tools/run_python``,
resending the history, as agents do without the Responses API. For each task, measured per
task:

    overhead per iteration = (wall - model time - tool time) / (N + 1)

- wall: from the client's send to the last byte of the answer (of the last request, for
  the baseline), on this machine's loopback;
- model time: the mock's own time, from its side (last request byte read to answer
  written, ``GET /stats``): its mean per request over the cell times N + 1. Microseconds;
  it answers at once, so the model "decodes" in zero time;
- tool time: the sandbox's own ``duration_ms`` of each run (the runner's time around the
  code), read for the hosted loop from the store's recorded tool calls after the cell (the
  gateway records every hosted call's result there) and for the baseline from the
  ``/v1/tools`` answers. What the sandbox service does around a run (its HTTP hop, policy,
  attestation) thus counts as gateway time on both sides: the figure is an upper bound of
  the gateway's own cost, and the ratio compares like with like.

Each worker (one per concurrent client) uses one session for all its tasks, warmed by an
untimed first task: the sandbox's resident interpreter of a new session is a cold start
(bench.sandbox measures those), not loop overhead. Concurrency 1 and 16, and at
concurrency 1 the hosted loop with ``store: false`` too (what storing the response costs:
its writes wait for the recorder's queued steps to be committed). Each cell also
reports the CPU time of the gateway's process tree (gateway, recorder's writer, sandbox
service and its runs) per iteration: where the cores are few, latency at concurrency 16
is mostly waiting for them, and this says what each iteration costs.

**Chain load.** A 50-turn chain (text answers) is built through the API; then
``gateway.store.responses.load_chain`` (what ``previous_response_id`` runs: two queries) is
timed directly on the gateway's SQLite file, beside a 1-turn chain (the baseline); and
through the API, requests continuing the chain (``store: false``, so it does not grow) beside
the same request without ``previous_response_id``, alternating: the p50 difference is what
continuing a 50-turn chain adds (the load, 100 items to messages, a longer body upstream).

    python -m bench.agent_loop [--quick] [--steps 4] [--tool run_python|list_dir]

``--tool list_dir``: each tool step lists the workspace instead (a hosted ``{"type":
"sandbox", "name": "list_dir"}`` tool; the baseline calls ``/v1/tools/list_dir``). The
sandbox service answers it itself, with no process run: at concurrency 16 on two cores,
run_python's process is most of each iteration's CPU and so of the wait for the cores; with
list_dir what is left is the gateway's own cost (and the service's, counted with it).

Needs root and bubblewrap (the sandbox), like bench.sandbox. Progress on stderr; the last
line is one JSON object: ``iteration_overhead_p50_ms`` / ``_p99_ms`` (hosted, concurrency
16), ``chain50_load_p50_ms``, the baseline's figures and the ratios (``ratios``), every
cell, and the targets of issue #23 (reported, not asserted).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from sqlalchemy import select

from bench import sandbox_api as api
from bench.procs import start, stop, tree_cpu_seconds, wait_http
from bench.proxies import KEY, free_port
from bench.sandbox import timed
from gateway.store.database import make_engine
from gateway.store.responses import load_chain
from gateway.store.schema import tool_calls

AUTH = {"authorization": f"Bearer {KEY}"}
# the hosted tool of each --tool, and the output item type its calls give
HOSTED_TOOLS: dict[str, tuple[list[dict[str, Any]], str]] = {
    "run_python": ([{"type": "code_interpreter", "container": "auto"}], "code_interpreter_call"),
    "list_dir": ([{"type": "sandbox", "name": "list_dir"}], "mcp_call"),
}
TARGETS = {"iteration_overhead_p50_ms": 2.0, "iteration_overhead_p99_ms": 5.0,
           "chain50_load_p50_ms": 5.0}  # fmt: skip


def progress(message: str) -> None:
    print(f"[bench.agent_loop {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass
class Task:
    id: str
    wall_ms: float = 0.0
    tool_ms: float | None = None  # None: not known (hosted: until read from the store)
    ok: bool = False


@dataclass
class Bench:
    http: aiohttp.ClientSession
    gw: api.Gateway
    upstream: str
    store_url: str
    steps: int
    tool: str = "run_python"
    run: str = field(default_factory=lambda: secrets.token_hex(3))
    errors: dict[str, int] = field(default_factory=dict)
    chat_tools: list[dict[str, Any]] = field(default_factory=list)

    def error(self, kind: str, detail: object) -> None:
        if not self.errors:
            progress(f"first error: {kind}: {str(detail)[:500]}")
        self.errors[kind] = self.errors.get(kind, 0) + 1

    async def post(self, path: str, body: dict[str, Any], session: str) -> tuple[int, Any]:
        headers = AUTH | {"x-session-id": session}
        async with self.http.post(self.gw.url + path, json=body, headers=headers) as r:
            raw = await r.read()
        return r.status, orjson.loads(raw) if raw.startswith(b"{") else raw[:300]

    async def mock_stats(self) -> tuple[int, float]:
        async with self.http.get(self.upstream + "/stats") as r:
            data = await r.json(content_type=None)
        return int(data["requests"]), float(data["busy_ms"])

    # -- one task, two ways ------------------------------------------------------------

    async def hosted(self, session: str, task: Task, store: bool = True) -> None:
        tools, item_type = HOSTED_TOOLS[self.tool]
        body: dict[str, Any] = {
            "model": "auto", "input": f"task {task.id} steps={self.steps}", "tools": tools,
        }  # fmt: skip
        if not store:
            body["store"] = False
        t = time.perf_counter()
        status, data = await self.post("/v1/responses", body, session)
        task.wall_ms = (time.perf_counter() - t) * 1000
        calls = [i for i in data.get("output", ())] if isinstance(data, dict) else []
        ran = [i for i in calls if i["type"] == item_type]
        if status != 200 or data.get("status") != "completed":
            self.error(f"hosted: {status} {str(data)[:80]}", data)
        elif len(ran) != self.steps or any(i["status"] != "completed" for i in ran):
            self.error(f"hosted: a {item_type} did not complete", ran)
        else:
            task.ok = True

    async def unstored(self, session: str, task: Task) -> None:
        await self.hosted(session, task, store=False)

    async def client_loop(self, session: str, task: Task) -> None:
        messages: list[dict[str, Any]] = [
            {"role": "user", "content": f"task {task.id} steps={self.steps}"}
        ]
        tool_ms = 0.0
        t = time.perf_counter()
        for _ in range(self.steps + 1):
            body = {"model": "auto", "messages": messages, "tools": self.chat_tools}
            status, data = await self.post("/v1/chat/completions", body, session)
            if status != 200:
                return self.error(f"chat: {status}", data)
            message = data["choices"][0]["message"]
            messages.append(message)
            for call in message.get("tool_calls") or ():
                args = orjson.loads(call["function"]["arguments"])
                body = {"arguments": args, "tool_call_id": call["id"]}
                status, out = await self.post(f"/v1/tools/{self.tool}", body, session)
                ran = (
                    isinstance(out, dict)
                    and out.get("allowed")
                    and out.get("exit_status") in (0, None)
                )
                if status != 200 or not ran:
                    return self.error(f"tool: {status}", out)
                tool_ms += float(out["duration_ms"])
                text = (
                    out["stdout"]
                    if self.tool == "run_python"
                    else orjson.dumps(out["output"]).decode()
                )
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": text})
        task.wall_ms = (time.perf_counter() - t) * 1000
        task.tool_ms, task.ok = tool_ms, True

    # -- a cell ------------------------------------------------------------------------

    async def cell(self, mode: str, concurrency: int, per_worker: int) -> dict[str, Any]:
        run = {"hosted": self.hosted, "client": self.client_loop, "unstored": self.unstored}[mode]
        sessions = [f"{mode}-c{concurrency}-{w}-{self.run}" for w in range(concurrency)]
        warm = [Task(f"w{k}{self.run}") for k in range(concurrency)]
        await asyncio.gather(*(run(s, t) for s, t in zip(sessions, warm, strict=True)))
        tasks: list[Task] = []
        requests0, busy0 = await self.mock_stats()

        async def worker(w: int) -> None:
            for k in range(per_worker):
                task = Task(f"{mode[0]}{concurrency}x{w}x{k}x{self.run}")
                tasks.append(task)
                await run(sessions[w], task)

        cpu0, t = tree_cpu_seconds(self.gw.proc.pid, reaped=True), time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.perf_counter() - t
        cpu_ms = (tree_cpu_seconds(self.gw.proc.pid, reaped=True) - cpu0) * 1000
        requests1, busy1 = await self.mock_stats()
        model_ms = (busy1 - busy0) / max(1, requests1 - requests0)
        if mode != "client":
            await self.tool_times([t for t in tasks if t.ok])
        out = self.figures(mode, concurrency, tasks, model_ms, elapsed)
        out["gateway_tree_cpu_ms_per_iteration"] = round(
            cpu_ms / (len(tasks) * (self.steps + 1)), 3
        )
        print(f"{'':8s}       gateway process tree (gateway, writer, sandbox and its runs): "
              f"{out['gateway_tree_cpu_ms_per_iteration']} CPU-ms per iteration", flush=True)  # fmt: skip
        return out

    def figures(
        self, mode: str, c: int, tasks: list[Task], model_ms: float, elapsed: float
    ) -> dict[str, Any]:
        iters = self.steps + 1
        done = [t for t in tasks if t.ok and t.tool_ms is not None]
        if not done:
            raise RuntimeError(f"every {mode} task at concurrency {c} failed: {self.errors}")
        per = [(t.wall_ms - iters * model_ms - (t.tool_ms or 0.0)) / iters for t in done]
        tools = [(t.tool_ms or 0.0) / self.steps for t in done] if self.steps else [0.0]
        out = {
            "tasks": len(done), "failed": len(tasks) - len(done),
            "overhead_per_iteration_p50_ms": round(statistics.median(per), 3),
            "overhead_per_iteration_p99_ms": round(pct(per, 0.99), 3),
            "wall_per_task_p50_ms": round(statistics.median(t.wall_ms for t in done), 2),
            "tool_ms_per_call_p50": round(statistics.median(tools), 3),
            "model_ms_per_step": round(model_ms, 4),
            "tasks_per_s": round(len(done) / elapsed, 1),
        }  # fmt: skip
        print(f"{mode:8s} c={c:2d}: {out['tasks']:4d} tasks, overhead/iteration p50 "
              f"{out['overhead_per_iteration_p50_ms']:7.3f} ms p99 "
              f"{out['overhead_per_iteration_p99_ms']:7.3f} ms; task wall p50 "
              f"{out['wall_per_task_p50_ms']:7.2f} ms, tool {out['tool_ms_per_call_p50']:.2f} ms/call,"
              f" model {model_ms:.4f} ms/step, {out['tasks_per_s']} tasks/s", flush=True)  # fmt: skip
        return out

    async def tool_times(self, tasks: list[Task], timeout_s: float = 120) -> None:
        """The sandbox's duration of each task's hosted calls, from the recorded tool calls
        (call ids ``call_<task>_<k>``, bench.loop_upstream), once all are written."""
        wanted = {f"call_{t.id}_{k}": t for t in tasks for k in range(self.steps)}
        engine = make_engine(self.store_url)
        deadline = time.monotonic() + timeout_s
        try:
            while True:
                with engine.connect() as conn:
                    rows = conn.execute(
                        select(tool_calls.c.call_id, tool_calls.c.duration_ms).where(
                            tool_calls.c.call_id.in_(list(wanted)),
                            tool_calls.c.duration_ms.is_not(None),
                        )
                    ).all()
                if len(rows) == len(wanted) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
        finally:
            engine.dispose()
        if len(rows) < len(wanted):
            self.error("hosted: tool results not in the store", f"{len(rows)}/{len(wanted)}")
        found: dict[str, float] = {}
        for call_id, ms in rows:
            task = wanted[call_id].id
            found[task] = found.get(task, 0.0) + float(ms)
        for t in tasks:
            count = sum(1 for c in rows if wanted[c[0]] is t)
            t.tool_ms = found.get(t.id, 0.0) if count == self.steps else None


# -- the chain ---------------------------------------------------------------------------


async def chain(b: Bench, turns: int, n: int) -> dict[str, float]:
    progress(f"chain: building {turns} turns through the API")
    session, ids = f"chain-{b.run}", []
    prev: str | None = None
    for k in range(turns):
        body: dict[str, Any] = {"model": "auto", "input": f"task t{k} steps=0"}
        if prev is not None:
            body["previous_response_id"] = prev
        status, data = await b.post("/v1/responses", body, session)
        if status != 200:
            raise RuntimeError(f"chain turn {k}: {status} {data}")
        prev = data["id"]
        ids.append(prev)
    assert prev is not None
    progress(f"chain: {n} direct load_chain calls of {turns} turns and of 1, on the store")
    engine = make_engine(b.store_url)
    try:
        with engine.connect() as conn:
            assert len(load_chain(conn, "bench", prev).items) == 2 * turns

            async def load(ident: str) -> None:
                load_chain(conn, "bench", ident)

            long = await timed(n, lambda: load(prev))
            short = await timed(n, lambda: load(ids[0]))
    finally:
        engine.dispose()
    progress(f"chain: {n} API requests continuing it, and as many without it, alternating")
    with_prev: list[float] = []
    without: list[float] = []
    for _ in range(n):
        for out, extra in ((with_prev, {"previous_response_id": prev}), (without, {})):
            body = {"model": "auto", "input": "task more steps=0", "store": False, **extra}
            t = time.perf_counter()
            status, data = await b.post("/v1/responses", body, f"chain-probe-{b.run}")
            out.append((time.perf_counter() - t) * 1000)
            if status != 200:
                b.error(f"chain probe: {status}", data)
    fig = {
        f"chain{turns}_load_p50_ms": round(statistics.median(long), 3),
        f"chain{turns}_load_p99_ms": round(pct(long, 0.99), 3),
        "chain1_load_p50_ms": round(statistics.median(short), 3),
        f"chain{turns}_api_added_p50_ms": round(statistics.median(with_prev) - statistics.median(without), 3),
        "chain_api_without_p50_ms": round(statistics.median(without), 3),
    }  # fmt: skip
    print(f"chain: load_chain {turns} turns p50 {fig[f'chain{turns}_load_p50_ms']} ms, 1 turn p50 "
          f"{fig['chain1_load_p50_ms']} ms; through the API continuing it adds "
          f"{fig[f'chain{turns}_api_added_p50_ms']} ms p50", flush=True)  # fmt: skip
    return fig


# -- the run -----------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def loop_upstream(tmp: Path, tool: str) -> AsyncIterator[str]:
    port = free_port()
    log = tmp / "upstream.log"
    argv = [sys.executable, "-m", "bench.loop_upstream", "--port", str(port), "--tool", tool]
    proc = start(argv, log)
    try:
        url = f"http://127.0.0.1:{port}"
        await asyncio.to_thread(wait_http, url + "/stats", proc, log, 60)
        yield url
    finally:
        stop(proc)


def ratios(cells: dict[str, dict[str, Any]]) -> dict[str, float]:
    hosted, client = cells["hosted/c16"], cells["client/c16"]
    p50, p99 = "overhead_per_iteration_p50_ms", "overhead_per_iteration_p99_ms"
    return {
        "iteration_overhead_p50_ms": hosted[p50],
        "iteration_overhead_p99_ms": hosted[p99],
        "iteration_overhead_c1_p50_ms": cells["hosted/c1"][p50],
        "iteration_overhead_c1_p99_ms": cells["hosted/c1"][p99],
        "iteration_overhead_c1_store_false_p50_ms": cells["unstored/c1"][p50],
        "baseline_client_loop_p50_ms": client[p50],
        "baseline_client_loop_p99_ms": client[p99],
        "baseline_client_loop_c1_p50_ms": cells["client/c1"][p50],
        "iteration_overhead_p50_ratio_vs_client_loop": round(hosted[p50] / client[p50], 3),
        "iteration_overhead_p99_ratio_vs_client_loop": round(hosted[p99] / client[p99], 3),
        "cpu_per_iteration_ratio_vs_client_loop": round(
            hosted["gateway_tree_cpu_ms_per_iteration"]
            / client["gateway_tree_cpu_ms_per_iteration"],
            3,
        ),
        "task_wall_p50_ratio_vs_client_loop": round(
            hosted["wall_per_task_p50_ms"] / client["wall_per_task_p50_ms"], 3
        ),
    }


async def main_async(quick: bool, steps: int, tool: str = "run_python") -> dict[str, Any]:
    per_worker = {1: 5, 16: 1} if quick else {1: 100, 16: 20}
    turns, probes = (50, 5) if quick else (50, 100)
    with tempfile.TemporaryDirectory(prefix="gearshift-agent-loop-") as tmp:
        async with loop_upstream(Path(tmp), tool) as upstream:
            progress("starting gearshift serve (keys, recording to SQLite, sandbox)")
            connector = aiohttp.TCPConnector(limit=64)
            async with (
                api.gateway(Path(tmp), upstream) as gw,
                aiohttp.ClientSession(connector=connector) as http,
            ):
                b = Bench(http, gw, upstream, f"sqlite:///{tmp}/trajectories.db", steps, tool)
                async with http.get(gw.url + "/v1/tools", headers=AUTH) as r:
                    listed = await r.json(content_type=None)
                b.chat_tools = [t for t in listed["data"] if t["function"]["name"] == tool]
                cells: dict[str, dict[str, Any]] = {}
                for c, mode in [
                    (1, "client"),
                    (1, "hosted"),
                    (1, "unstored"),
                    (16, "client"),
                    (16, "hosted"),
                ]:
                    progress(f"{mode} loop, concurrency {c}: {c * per_worker[c]} tasks "
                                 f"of {steps} {tool} steps")  # fmt: skip
                    cells[f"{mode}/c{c}"] = await b.cell(mode, c, per_worker[c])
                chained = await chain(b, turns, probes)
    return {
        **ratios(cells),
        **chained,
        "chain50_ratio_vs_chain1": round(
            chained["chain50_load_p50_ms"] / chained["chain1_load_p50_ms"], 2
        ),
        "steps": steps,
        "tool": tool,
        "errors": b.errors,
        "cells": cells,
        "targets": TARGETS,
    }


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="a few tasks per cell (seconds)")
    p.add_argument("--steps", type=int, default=4, help="tool steps per task (default 4)")
    p.add_argument(
        "--tool", choices=sorted(HOSTED_TOOLS), default="run_python",
        help="the call each tool step makes: run_python (a process in the session's "
        "interpreter) or list_dir (answered by the sandbox service itself: the loop's cost "
        "with the cheapest tool run)",
    )  # fmt: skip
    a = p.parse_args()
    print(json.dumps(asyncio.run(main_async(a.quick, a.steps, a.tool))))


if __name__ == "__main__":
    main()
