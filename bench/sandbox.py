"""Sandbox start-up and throughput against plain ``subprocess``, in one run.

- cold: one sandboxed run per call (cgroup, seccomp filter, bubblewrap namespaces) of
  ``/bin/true`` and ``python3 -c 'print(1)'``, p50/p99, next to the same commands run with
  ``asyncio.create_subprocess_exec`` and no isolation;
- warm: repeated ``run_python`` calls in one session through ``Sandbox.call`` (policy,
  faults, attestation included);
- throughput: warm tool calls per second over 4 sessions, one call in flight each.

    python -m bench.sandbox [--quick]

Needs root and bubblewrap, like the service. Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from sandbox.config import GrantConfig, Resources, SandboxConfig
from sandbox.core import Sandbox
from sandbox.policy import ResourceClass
from sandbox.protocol import Principal, SessionCreate, ToolCall
from sandbox.runtime.bwrap import BwrapRuntime
from sandbox.runtime.gvisor import RunscRuntime

WHO = Principal(tenant="bench", key="k")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


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


async def main_async(quick: bool) -> dict[str, float]:
    n = 30 if quick else 150
    root = Path(tempfile.mkdtemp(prefix="gearshift-sbx-bench-"))
    os.chmod(root, 0o711)
    ws = root / "ws"
    ws.mkdir()
    os.chown(ws, 65534, 65534)
    rt = BwrapRuntime()
    limits = ResourceClass()
    result: dict[str, float] = {}
    try:
        for name, argv in (
            ("true", ["/bin/true"]),
            ("python", ["/usr/bin/python3", "-c", "print(1)"]),
        ):
            base = await timed(n, lambda a=argv: plain(a))  # type: ignore[misc]
            cold = await timed(n, lambda a=argv: rt.run(a, ws, limits))  # type: ignore[misc]
            result[f"cold_{name}_p50_ms"] = round(statistics.median(cold), 2)
            result[f"cold_{name}_p99_ms"] = round(pct(cold, 0.99), 2)
            result[f"plain_{name}_p50_ms"] = round(statistics.median(base), 2)
            print(f"{name:6s} sandboxed p50 {statistics.median(cold):6.1f} ms p99 {pct(cold, 0.99):6.1f} ms"
                  f" | plain subprocess p50 {statistics.median(base):5.1f} ms", flush=True)  # fmt: skip
        gv = RunscRuntime()
        gvisor = await timed(max(5, n // 10), lambda: gv.run(["/bin/true"], ws, limits))
        result["cold_gvisor_true_p50_ms"] = round(statistics.median(gvisor), 1)
        print(f"gVisor /bin/true p50 {statistics.median(gvisor):6.1f} ms", flush=True)
        config = SandboxConfig(
            token="bench", root=root,
            grants_by_tenant={"bench": GrantConfig(tools=["run_python"], resources=Resources())},
        )  # fmt: skip
        sandbox = Sandbox(config)
        sid = sandbox.create(SessionCreate(principal=WHO)).id
        call = ToolCall(principal=WHO, session_id=sid, arguments={"code": "print(1)"})
        warm = await timed(n, lambda: sandbox.call("run_python", call))
        result["warm_p50_ms"] = round(statistics.median(warm), 2)
        result["warm_p99_ms"] = round(pct(warm, 0.99), 2)
        total = 60 if quick else 300
        # Four sessions, one call in flight each: calls within a session run one at a time.
        sids = [sandbox.create(SessionCreate(principal=WHO)).id for _ in range(4)]
        calls = [
            ToolCall(principal=WHO, session_id=x, arguments={"code": "print(1)"}) for x in sids
        ]
        for c in calls:  # start their interpreters
            await sandbox.call("run_python", c)
        started = time.perf_counter()

        async def worker(c: ToolCall) -> None:
            for _ in range(total // 4):
                await sandbox.call("run_python", c)

        await asyncio.gather(*(worker(c) for c in calls))
        result["calls_per_s"] = round(total / (time.perf_counter() - started), 1)
        print(f"warm run_python p50 {result['warm_p50_ms']} ms p99 {result['warm_p99_ms']} ms;"
              f" {result['calls_per_s']} calls/s over 4 sessions", flush=True)  # fmt: skip
        for x in [sid, *sids]:
            await sandbox.remove(x)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    result["cold_p50_ms"] = result["cold_true_p50_ms"]
    return result


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    print(json.dumps(asyncio.run(main_async(a.quick))))


if __name__ == "__main__":
    main()
