"""What a warm call's kernel-side usage and the gateway → sandbox hop cost, A/B in one run.

Both in this process, arms alternating in blocks of calls so that the machine's load
falls on both alike (CPU-ms per call is the robust figure on a shared machine):

- ``usage``: warm ``run_python`` (``print(1)``) through ``Sandbox.call`` in two sessions of
  one sandbox, one with its call cgroup (``sandbox.runtime.call_usage``: usage from the
  kernel) and one without (``before``: the child's own report, as before #28's call
  cgroup). Per call: wall p50, this process's CPU (the service's: event loop and the
  thread that moves each child) and the session cgroup's (the runner, the child, its run);
- ``hop``: the same call made directly (``Sandbox.call``) and through the gateway's
  ``SandboxClient`` over the service's frames socket (``sandbox.frames``; both ends in
  this process, one event loop): what the hop's framing, JSON and models cost.

    python -m bench.sandbox_usage [--quick]

Needs root and bubblewrap, like the service. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from pydantic import SecretStr

from sandbox import frames
from sandbox.client import SandboxClient
from sandbox.config import GrantConfig, Resources, SandboxConfig
from sandbox.core import Sandbox
from sandbox.protocol import Principal, ToolCall, ToolResult
from sandbox.runtime.warm import WarmPython
from sandbox.service import error_answer
from sandbox.workspace import sweep

WHO = Principal(tenant="bench", key="k")
ARGS = {"code": "print(1)"}
Arm = Callable[[], Awaitable[ToolResult]]


def _session_cpu_ms(warm: WarmPython | None) -> float:
    if warm is None or warm.cg is None or "cpuacct" not in warm.cg.dirs:
        return 0.0  # v2 hosts: cpu.stat; the process's CPU is the figure compared here
    return int((warm.cg.dirs["cpuacct"] / "cpuacct.usage").read_text()) / 1e6


async def alternate(
    arms: dict[str, tuple[Arm, WarmPython | None]], rounds: int, block: int
) -> dict[str, dict[str, float]]:
    walls: dict[str, list[float]] = {a: [] for a in arms}
    cpu = dict.fromkeys(arms, 0.0)
    tree = dict.fromkeys(arms, 0.0)
    for _ in range(rounds):
        for name, (call, warm) in arms.items():
            c0, t0 = time.process_time(), _session_cpu_ms(warm)
            for _ in range(block):
                started = time.perf_counter()
                result = await call()
                walls[name].append((time.perf_counter() - started) * 1000)
                assert result.exit_status == 0, result
            await asyncio.sleep(0.02)  # the block's last child ends within it
            cpu[name] += (time.process_time() - c0) * 1000
            tree[name] += _session_cpu_ms(warm) - t0
    n = rounds * block
    return {
        a: {"p50_ms": round(statistics.median(walls[a]), 2),
            "process_cpu_ms_per_call": round(cpu[a] / n, 3),
            "session_cpu_ms_per_call": round(tree[a] / n, 3)}
        for a in arms
    }  # fmt: skip


async def run(quick: bool) -> dict[str, object]:
    rounds, block = (3, 10) if quick else (10, 20)
    root = Path(tempfile.mkdtemp(prefix="gearshift-sbx-"))
    os.chmod(root, 0o711)  # the sandbox uid must reach the workspaces
    grant = GrantConfig(tools=["run_python"], resources=Resources())
    config = SandboxConfig(token=SecretStr("bench"), root=root, pool=0, kernel_usage=True,
                           grants_by_tenant={WHO.tenant: grant})  # fmt: skip
    sandbox = Sandbox(config)
    socket = root / "frames.sock"
    server = await frames.serve(
        sandbox, frames.frames_path(socket), 1 << 20, lambda e: error_answer(e, "frames")
    )
    client = SandboxClient("http://sandbox", "bench", socket=str(socket))
    try:
        sessions: dict[str, tuple[Arm, WarmPython | None]] = {}
        for arm in ("before", "kernel"):
            call = ToolCall(principal=WHO, session_id=arm, arguments=ARGS, create_session=True)
            await sandbox.call("run_python", call)
            warm = sandbox.sessions[arm].warm
            assert warm is not None and warm.calls is not None, "no call cgroup on this host"
            if arm == "before":  # its runner again, as with sandbox.kernel_usage off
                await warm.stop()
                warm.kernel_usage = False
            for _ in range(2):  # its runner, then a call whose child was moved
                await sandbox.call("run_python", call)
            assert (warm.calls is not None) == (arm == "kernel")
            sessions[arm] = (functools.partial(sandbox.call, "run_python", call), warm)
        usage = await alternate(sessions, rounds, block)
        direct, warm = sessions["kernel"]

        async def via_frames() -> ToolResult:
            return await client.call(WHO.tenant, WHO.key, "kernel", "run_python", ARGS)

        hop = await alternate(
            {"direct": (direct, warm), "frames": (via_frames, warm)}, rounds, block
        )
    finally:
        await client.close()
        server.close()
        await sandbox.close()
        sweep(root)
    return {"usage": usage, "hop": hop, "load_avg_end": round(os.getloadavg()[0], 1)}


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="fewer calls (seconds)")
    a = p.parse_args()
    load = round(os.getloadavg()[0], 1)
    result = asyncio.run(run(a.quick))
    for part in ("usage", "hop"):
        for arm, f in result[part].items():  # type: ignore[attr-defined]
            print(f"{part:5s} {arm:7s} p50 {f['p50_ms']:6.2f} ms, process "
                  f"{f['process_cpu_ms_per_call']:.2f} CPU-ms/call, session "
                  f"{f['session_cpu_ms_per_call']:.2f} CPU-ms/call", flush=True)  # fmt: skip
    print(json.dumps({"load_avg_start": load, **result}))


if __name__ == "__main__":
    main()
