"""The supervisor with real child processes (small HTTP servers standing in for vLLM)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from backends.supervisor import ServerState, Supervisor, SupervisorError
from backends.vllm_server import VllmServerSpec
from tests.support.servers import free_port

DUMMY = Path(__file__).with_name("dummy_server.py")


def specs(n: int) -> list[VllmServerSpec]:
    return [VllmServerSpec(f"s{i}", Path("/m"), f"m{i}", free_port()) for i in range(n)]


def supervisor(
    tmp_path: Path, servers: list[VllmServerSpec], mode: str = "ok", delay: float = 0.2, **kw
) -> Supervisor:
    return Supervisor(
        servers,
        python=Path(sys.executable),
        log_dir=tmp_path,
        startup_timeout_s=kw.pop("startup_timeout_s", 20),
        argv_for=lambda s, py: [str(py), str(DUMMY), str(s.port), str(delay), mode],
        **kw,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes.
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().split(") ", 1)[1][0] != "Z"


async def test_starts_waits_and_restarts_a_dead_server(tmp_path):
    sup = supervisor(tmp_path, specs(2), max_restarts=2)
    await sup.start()
    try:
        await asyncio.wait_for(sup.wait_ready(), 20)
        assert set(sup.states().values()) == {ServerState.READY}
        victim = sup.servers["s0"]
        os.kill(victim.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while not (victim.restarts == 1 and victim.state is ServerState.READY):
            assert time.monotonic() < deadline, victim.state
            await asyncio.sleep(0.1)
        assert victim.last_exit == -signal.SIGKILL
        assert sup.servers["s1"].restarts == 0
    finally:
        await sup.stop()
    assert set(sup.states().values()) == {ServerState.STOPPED}


async def test_vllm_sockets_live_in_a_folder_of_the_server_removed_at_stop(tmp_path):
    """vLLM binds ZeroMQ sockets under VLLM_RPC_BASE_PATH (the temporary folder by default)
    and a killed server leaves them: each start gets a private folder, cleared at restart
    and removed at stop."""
    sup = supervisor(tmp_path, specs(1), max_restarts=1)
    await sup.start()
    try:
        await asyncio.wait_for(sup.wait_ready(), 20)
        m = sup.servers["s0"]
        first = m.rpc_dir
        assert first is not None and first.name.startswith("gearshift-vllm-s0-")
        assert first.stat().st_mode & 0o777 == 0o700 and len(list(first.iterdir())) == 1
        assert f"rpc {first}" in m.log_path.read_text()
        os.kill(m.process.pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while not (m.restarts == 1 and m.state is ServerState.READY):
            assert time.monotonic() < deadline, m.state
            await asyncio.sleep(0.1)
        assert m.rpc_dir != first and not first.exists() and m.rpc_dir.exists()
        second = m.rpc_dir
    finally:
        await sup.stop()
    assert not second.exists() and m.rpc_dir is None


async def test_a_server_that_keeps_crashing_is_reported(tmp_path):
    sup = supervisor(tmp_path, specs(1), mode="crash", max_restarts=1)
    await sup.start()
    try:
        with pytest.raises(
            SupervisorError, match=r"(?s)failed to start \(exit 3\).*crashing on purpose"
        ):
            await asyncio.wait_for(sup.wait_ready(), 20)
        assert sup.servers["s0"].restarts == 1
    finally:
        await sup.stop()


async def test_startup_timeout_kills_the_server(tmp_path):
    sup = supervisor(tmp_path, specs(1), delay=60, max_restarts=0, startup_timeout_s=1)
    await sup.start()
    try:
        with pytest.raises(SupervisorError):
            await asyncio.wait_for(sup.wait_ready(), 20)
    finally:
        await sup.stop()


async def test_stop_takes_the_whole_process_group(tmp_path):
    sup = supervisor(tmp_path, specs(1), mode="grandchild")
    await sup.start()
    await asyncio.wait_for(sup.wait_ready(), 20)
    log = sup.servers["s0"].log_path.read_text()
    grandchild = int(re.search(r"grandchild (\d+)", log).group(1))
    assert alive(grandchild)
    await sup.stop()
    deadline = time.monotonic() + 5
    while alive(grandchild):
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


def test_servers_die_with_a_killed_supervisor(tmp_path):
    """kill -9 of the process running the supervisor must not leave servers behind."""
    port = free_port()
    script = textwrap.dedent(f"""
        import asyncio, sys
        from pathlib import Path
        from backends.supervisor import Supervisor
        from backends.vllm_server import VllmServerSpec
        async def main():
            sup = Supervisor([VllmServerSpec("s", Path("/m"), "m", {port})], python=Path(sys.executable),
                             log_dir=Path({str(tmp_path)!r}),
                             argv_for=lambda s, py: [str(py), {str(DUMMY)!r}, str(s.port), "0", "ok"])
            await sup.start()
            await sup.wait_ready()
            print(sup.servers["s"].process.pid, flush=True)
            await asyncio.sleep(600)
        asyncio.run(main())
    """)
    parent = subprocess.Popen(
        [sys.executable, "-c", script],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
        # pytest's folder is too long a path for sockets: the supervisor falls back to /tmp
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    try:
        child = int(parent.stdout.readline())
        assert alive(child)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 5
        while alive(child):
            assert time.monotonic() < deadline, "server outlived its supervisor"
            time.sleep(0.05)
    finally:
        parent.kill()
        # a killed supervisor cannot remove its server's socket folder: the test does
        for line in (tmp_path / f"vllm-s-{port}.log").read_text().splitlines():
            if line.startswith("rpc "):
                assert line.startswith("rpc /tmp/gearshift-vllm-s-"), line
                shutil.rmtree(line.removeprefix("rpc "), ignore_errors=True)
