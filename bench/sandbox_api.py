"""Tool calls as an agent makes them: ``POST /v1/tools/{name}`` through a real gateway.

``gateway`` starts ``gearshift serve`` on 127.0.0.1 in the operator configuration of
bench.gateway_overhead (API keys, recording to SQLite, the sandbox service it starts, its
own policy and attestation), with one change: a grant of ``run_python`` and ``run_shell``
to the benchmark's tenant, its workspaces in a temporary folder. The gateway needs tiers
to start; they point at ``ToolTurnUpstream``, bench.mock_upstream served in this process
whose non-stream chat answers are tool-call turns.

``Agent`` is the client side. Before a cell, untimed, each of its sessions makes chat steps
that the gateway records, each answering with ``CALLS_PER_STEP`` tool calls, and waits
until the store has them; each timed call then answers one of those calls
(``tool_call_id``), so its result, rewards and attestation are written to the store on
the call's path, as an agent's would be. A call that did not run, exit 0 and get recorded
is an error: counted, left out of the latencies, and the first one's answer and the
gateway's log kept for the report.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import yaml

from bench.mock_upstream import STREAM_RE, MockProtocol, chat_answer
from bench.procs import process_cpu_seconds, process_tree, start, tree_cpu_seconds
from bench.proxies import KEY, free_port, gearshift_config

TENANT = "bench"
TOOLS = ("run_python", "run_shell")
ARGUMENTS: dict[str, dict[str, str]] = {
    "run_python": {"code": "print(1)"},
    "run_shell": {"command": "echo 1"},
}
CALLS_PER_STEP = 64
_ids = itertools.count()


def tool_turn(body: bytes) -> bytes:
    """A chat answer making ``CALLS_PER_STEP`` calls of the tool the last message names
    (``run_python`` unless it names another), ids unique to this process."""
    request = orjson.loads(body)
    tool = str(request["messages"][-1].get("content"))
    tool = tool if tool in ARGUMENTS else "run_python"
    calls = [
        {"id": f"call_{next(_ids)}", "type": "function",
         "function": {"name": tool, "arguments": orjson.dumps(ARGUMENTS[tool]).decode()}}
        for _ in range(CALLS_PER_STEP)
    ]  # fmt: skip
    message = {"role": "assistant", "content": None, "tool_calls": calls}
    return chat_answer(body, message, "tool_calls", 20, "tools")


class ToolTurnUpstream(MockProtocol):
    def respond(self, head: bytes, body: bytes) -> None:
        if head.startswith(b"post /v1/chat/completions ") and not STREAM_RE.search(body):
            self.write_answer(tool_turn(body))
        else:
            super().respond(head, body)


@contextlib.asynccontextmanager
async def tool_upstream() -> AsyncIterator[str]:
    """The mock on a free port of 127.0.0.1, served by this process's event loop."""
    port = free_port()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ToolTurnUpstream(20, 0.001), "127.0.0.1", port)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.close()


def config_text(tmp: Path, port: int, upstream: str, pool: int | None = None) -> str:
    """bench.gateway_overhead's operator configuration, plus the grant and a private root
    (and ``sandbox.pool`` when ``pool`` is given; else the default)."""
    config = yaml.safe_load(gearshift_config(tmp, port, upstream, operator=True))
    grant = {"tools": [*TOOLS, "list_dir"], "read": ["*"]}  # list_dir: bench.agent_loop
    config["sandbox"] |= {"root": str(tmp / "workspaces"), "grants_by_tenant": {TENANT: grant}}
    if pool is not None:
        config["sandbox"]["pool"] = pool
    return yaml.safe_dump(config)


@dataclass
class Gateway:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@contextlib.asynccontextmanager
async def gateway(
    tmp: Path, upstream: str, timeout_s: float = 600, pool: int | None = None
) -> AsyncIterator[Gateway]:
    """``gearshift serve`` with the sandbox it starts, not pinned (the target is for two
    cores); stopped with SIGINT, as an operator would, so that it stops its sandbox."""
    os.chmod(tmp, 0o711)  # the sandbox's uid must traverse to the workspaces
    port = free_port()
    path = tmp / "gearshift.yaml"
    path.write_text(config_text(tmp, port, upstream, pool))
    gearshift = Path(sys.executable).with_name("gearshift")
    argv = [str(gearshift), "--log-level", "warning", "serve", "--config", str(path)]
    gw = Gateway(
        f"http://127.0.0.1:{port}", start(argv, tmp / "gearshift.log"), tmp / "gearshift.log"
    )
    try:
        await _ready(gw, timeout_s)
        yield gw
    finally:
        _stop(gw.proc)


async def _ready(gw: Gateway, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as http:
        while time.monotonic() < deadline:
            if gw.proc.poll() is not None:
                raise RuntimeError(f"gearshift serve exited ({gw.proc.returncode}):\n{gw.tail()}")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with http.get(gw.url + "/ready") as r:
                    if r.status == 200:
                        return
            await asyncio.sleep(0.25)
    raise RuntimeError(f"gearshift serve not ready after {timeout_s} s:\n{gw.tail()}")


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 60) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


class Agent:
    """An agent's HTTP client: chat steps that make tool calls, and the calls."""

    def __init__(self, http: aiohttp.ClientSession, gw: Gateway) -> None:
        self.http, self.gw = http, gw
        self.auth = {"authorization": f"Bearer {KEY}"}
        self.run = secrets.token_hex(4)  # session names unique to this run
        self.errors, self.first_error = 0, ""
        # Of each successful call: the run's own duration, as the sandbox reports it (for a
        # warm session, the resident interpreter's, from request to the child's end).
        self.run_ms: list[float] = []
        self.error_kinds: collections.Counter[str] = collections.Counter()

    def session(self, label: str) -> str:
        return f"{label}-{self.run}"

    async def step(self, session: str, tool: str) -> list[str]:
        """One recorded chat step of ``session``; the ids of the tool calls it made."""
        body = {"model": "auto", "messages": [{"role": "user", "content": tool}]}
        headers = self.auth | {"x-session-id": session}
        async with self.http.post(
            self.gw.url + "/v1/chat/completions", json=body, headers=headers
        ) as r:
            data = await r.json(loads=orjson.loads, content_type=None)
            if r.status != 200:
                raise RuntimeError(f"chat step: {r.status} {data}")
        return [c["id"] for c in data["choices"][0]["message"]["tool_calls"]]

    async def call(self, session: str, tool: str, call_id: str) -> float | None:
        """One tool call answering ``call_id``: milliseconds until its answer was read, or
        None when it failed: counted in ``errors`` and by kind (status, and the error's
        message or the run's exit status and first line of stderr) in ``error_kinds``, the
        first one's answer and the gateway's log kept in ``first_error``."""
        body = {"arguments": ARGUMENTS[tool], "tool_call_id": call_id}
        headers = self.auth | {"x-session-id": session}
        t = time.perf_counter()
        async with self.http.post(
            self.gw.url + f"/v1/tools/{tool}", json=body, headers=headers
        ) as r:
            raw = await r.read()
        ms = (time.perf_counter() - t) * 1000
        out = orjson.loads(raw) if raw.startswith(b"{") else {}
        if r.status == 200 and out.get("exit_status") == 0 and out.get("recorded"):
            self.run_ms.append(float(out.get("duration_ms") or 0.0))
            return ms
        self.errors += 1
        self.error_kinds[_kind(tool, r.status, out)] += 1
        if not self.first_error:
            self.first_error = f"{tool} in {session}: {r.status} {raw[:500]!r}\n" + self.gw.tail()
        return None

    async def prepare(self, sessions: list[str], tool: str, calls: int) -> dict[str, list[str]]:
        """Recorded steps giving each session ``calls`` tool-call ids, committed to the store."""
        before = await self.recorded()
        steps = -(-calls // CALLS_PER_STEP)
        ids: dict[str, list[str]] = {s: [] for s in sessions}
        gate = asyncio.Semaphore(8)

        async def one(s: str) -> None:
            async with gate:
                ids[s] += await self.step(s, tool)

        await asyncio.gather(*(one(s) for s in sessions for _ in range(steps)))
        await self.drained(before + steps * len(sessions))
        return ids

    async def recorded(self) -> float:
        """Steps the recorder has written or given up on (the gateway's /metrics)."""
        async with self.http.get(self.gw.url + "/metrics") as r:
            text = await r.text()
        prefixes = ("gearshift_recorder_written_total", "gearshift_recorder_dropped_total")
        return sum(float(x.rsplit(" ", 1)[1]) for x in text.splitlines() if x.startswith(prefixes))

    async def drained(self, expected: float, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while await self.recorded() < expected:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"the recorder has not written {expected} steps:\n{self.gw.tail()}"
                )
            await asyncio.sleep(0.05)


def _kind(tool: str, status: int, out: dict[str, Any]) -> str:
    if "error" in out:
        return f"{tool}: {status} {str(out['error'].get('message'))[:100]}"
    stderr = str(out.get("stderr") or "").strip().splitlines()
    first = re.sub(r"[0-9a-f]{12,}", "ID", stderr[0])[:100] if stderr else ""
    return f"{tool}: {status} exit {out.get('exit_status')} recorded {out.get('recorded')} {first}"


def done(latencies: list[float | None]) -> list[float]:
    return [ms for ms in latencies if ms is not None]


async def cold(agent: Agent, tool: str, n: int, gap_s: float = 0.0) -> list[float]:
    """Each call the first of a new session (the sandbox creates the session; it gets a
    spare warm sandbox from the pool when one is ready, else its workspace is made and
    its resident interpreter started on the call's path). ``gap_s`` between calls stands
    for what comes before an agent's first tool call (at least one chat step): it lets
    the pool refill. Without it, calls come back to back and outrun the refill."""
    label = f"cold-{tool}-gap{gap_s:g}"
    sessions = [agent.session(f"{label}-{i}") for i in range(n)]
    ids = await agent.prepare(sessions, tool, 1)
    latencies = []
    for s in sessions:
        await asyncio.sleep(gap_s)
        latencies.append(await agent.call(s, tool, ids[s][0]))
    return done(latencies)


async def warm(agent: Agent, tool: str, n: int) -> list[float]:
    """Calls in one session after a first, untimed one."""
    s = agent.session(f"warm-{tool}")
    ids = (await agent.prepare([s], tool, n + 1))[s]
    await agent.call(s, tool, ids[0])
    return done([await agent.call(s, tool, i) for i in ids[1 : n + 1]])


@dataclass
class Load:
    concurrency: int
    calls_per_s: float
    latencies_ms: list[float]
    server_cores: float  # the gateway's process tree (gateway, writer, sandbox, runs): CPU-s/s
    client_cores: float  # this process's CPU-s/s
    server_cpu_ms_per_call: float
    # of it: the gateway's own process and the sandbox service's (the rest: the runs, the
    # store's writer process)
    gateway_cpu_ms_per_call: float
    sandbox_cpu_ms_per_call: float


def sandbox_service(gateway_pid: int) -> int:
    """The pid of the sandbox service ``gearshift serve`` started (``python -m sandbox``)."""
    for pid in process_tree(gateway_pid):
        with contextlib.suppress(OSError):
            if b"\0-m\0sandbox\0" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
    raise RuntimeError("the gateway runs no sandbox service")


async def load(agent: Agent, tool: str, concurrency: int, total: int) -> Load:
    """Warm calls over ``concurrency`` sessions, one call in flight each."""
    sessions = [agent.session(f"load-{tool}-c{concurrency}-{i}") for i in range(concurrency)]
    each = max(1, total // concurrency)
    ids = await agent.prepare(sessions, tool, each + 1)
    await asyncio.gather(*(agent.call(s, tool, ids[s][0]) for s in sessions))
    latencies: list[float] = []

    async def worker(s: str) -> None:
        for call_id in ids[s][1 : each + 1]:
            ms = await agent.call(s, tool, call_id)
            if ms is not None:
                latencies.append(ms)

    gw, sbx = agent.gw.proc.pid, sandbox_service(agent.gw.proc.pid)
    cpu0, gw0, sbx0 = (
        tree_cpu_seconds(gw, reaped=True),
        process_cpu_seconds(gw),
        process_cpu_seconds(sbx),
    )
    mine0, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker(s) for s in sessions))
    elapsed = time.perf_counter() - t0
    server = tree_cpu_seconds(gw, reaped=True) - cpu0
    per_call = 1000 / len(latencies)
    return Load(
        concurrency, len(latencies) / elapsed, latencies, server / elapsed,
        (time.process_time() - mine0) / elapsed, server * per_call,
        (process_cpu_seconds(gw) - gw0) * per_call, (process_cpu_seconds(sbx) - sbx0) * per_call,
    )  # fmt: skip
