"""File tools against what tool code can plant in its workspace: FIFOs, sockets, device
nodes, links and huge sparse files are refused or read bounded, never waited on; and one
tenant's stalled call never delays another tenant (over the real HTTP service)."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import stat
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from sandbox.config import GrantConfig, Resources, SandboxConfig
from sandbox.core import Sandbox
from sandbox.errors import ToolTimeout
from sandbox.service import create_app
from sandbox.tools.files import off_loop
from tests.sandbox.conftest import EVERYTHING, Harness
from tests.support.servers import serve_in_thread

WATCHDOG_S = 20.0  # a regression fails after this long instead of hanging the suite


@contextlib.contextmanager
def unblocking(fifo: Path, after_s: float = WATCHDOG_S) -> Iterator[list[bool]]:
    """Should the service ever wait on ``fifo``, open its other end after ``after_s`` so the
    test ends; the yielded list says whether that was needed (it must not be)."""
    fired: list[bool] = []
    done = threading.Event()

    def watch() -> None:
        if done.wait(after_s):
            return
        for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK):
            with contextlib.suppress(OSError):
                os.close(os.open(fifo, flags))
                fired.append(True)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield fired
    finally:
        done.set()
        thread.join()


@pytest.fixture
async def files(config: SandboxConfig) -> AsyncIterator[Harness]:
    """File tools run host-side, the same in every runtime: the cold one plants the files."""
    sandbox = Sandbox(config.model_copy(update={"warm": False}))
    yield Harness(sandbox, "cold")
    for sid in list(sandbox.sessions):
        await sandbox.remove(sid)


def workspace(h: Harness) -> Path:
    return h.sandbox.sessions[h.session].workspace.root


async def release(fifo: Path) -> None:
    """Give the reader blocked on ``fifo`` (once it is there) an end of file."""
    for _ in range(int(WATCHDOG_S / 0.05)):
        try:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
            return
        except OSError as exc:
            if exc.errno != errno.ENXIO:  # ENXIO: no reader yet
                raise
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing ever read {fifo}")


async def test_fifos_and_sockets_made_by_tool_code_are_refused_without_waiting(files: Harness):
    made = await files.sh(
        "mkfifo fifo && python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('sock')\""
    )
    assert made.exit_status == 0, made.stderr
    with unblocking(workspace(files) / "fifo") as fired:
        for path, kind in (("fifo", "a FIFO"), ("sock", "a socket")):
            r = await files("read_file", path=path)
            assert (r.allowed, r.rule) == (False, "file type") and kind in (r.reason or ""), r
            w = await files("write_file", path=path, content="x")
            assert (w.allowed, w.rule) == (False, "file type"), w
        listed = await files("list_dir", path="fifo")
        assert listed.exit_status == 1 and "Not a directory" in listed.stderr
    assert fired == []


async def test_device_nodes_are_refused_and_links_to_them_are_escapes(files: Harness):
    root = workspace(files)
    try:
        os.mknod(root / "zero", stat.S_IFCHR | 0o666, os.makedev(1, 5))  # /dev/zero
    except PermissionError:
        pytest.skip("no CAP_MKNOD here to make a device node")
    await files.sh("ln -s /dev/null nul; ln -s zero zerolink")
    r = await files("read_file", path="zero")
    assert (r.allowed, r.rule) == (False, "file type") and "device node" in (r.reason or "")
    w = await files("write_file", path="zero", content="x")
    assert (w.allowed, w.rule) == (False, "file type")
    for path in ("nul", "zerolink"):
        r = await files("read_file", path=path)
        assert (r.allowed, r.rule) == (False, "workspace"), (path, r)
    assert not (await files("read_file", path="/dev/null")).allowed


async def test_a_huge_sparse_file_is_read_bounded(files: Harness):
    with open(workspace(files) / "sparse", "wb") as f:
        f.truncate(64 << 30)  # 64 GiB, no blocks
    r = await files("read_file", path="sparse")
    assert r.allowed and r.exit_status == 0
    assert r.output["truncated"] and len(r.output["content"]) == EVERYTHING.resources.output_bytes


async def test_regular_files_still_read_write_append_and_list(files: Harness):
    assert (await files("write_file", path="a.txt", content="one\n")).output == {"written": 4}
    await files("write_file", path="a.txt", content="two\n", append=True)
    assert (await files("read_file", path="a.txt")).output["content"] == "one\ntwo\n"
    await files("write_file", path="a.txt", content="new\n")
    assert (await files("read_file", path="a.txt")).output["content"] == "new\n"
    seen = await files.py("print(open('a.txt').read(), end='')")
    assert seen.stdout == "new\n"  # owned by the sandbox uid: tool code may edit it too
    entries = (await files("list_dir")).output["entries"]
    assert {"name": "a.txt", "type": "file", "size": 4} in entries
    assert (await files("read_file", path=".")).exit_status == 1  # a directory is not read


async def test_a_stuck_file_operation_times_out_while_the_loop_runs_on():
    release = threading.Event()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    try:
        with pytest.raises(ToolTimeout) as caught:
            await off_loop(0.3, release.wait, WATCHDOG_S)
    finally:
        release.set()
        task.cancel()
    assert ticks > 0 and isinstance(caught.value, OSError)  # a call reports it as failed


class Tenant:
    """One tenant's session on the real service, over HTTP."""

    def __init__(self, http: httpx.AsyncClient, name: str) -> None:
        self.http, self.principal = http, {"tenant": name, "key": "k"}
        self.session = name

    async def start(self) -> Tenant:
        body = {"principal": self.principal, "session_id": self.session}
        r = await self.http.post("/v1/sessions", json=body)
        assert r.status_code == 201, r.text
        return self

    async def __call__(self, tool: str, **arguments: object) -> dict[str, Any]:
        body = {"principal": self.principal, "session_id": self.session, "arguments": arguments}
        r = await self.http.post(f"/v1/tools/{tool}", json=body)
        assert r.status_code == 200, r.text
        return dict(r.json())


async def test_one_tenants_stalled_calls_never_delay_another_tenant(config: SandboxConfig):
    slow = GrantConfig(**(EVERYTHING.model_dump() | {"resources": Resources(wall_s=60)}))
    config = config.model_copy(update={"grants_by_tenant": {"acme": slow, "beta": EVERYTHING}})
    auth = {"authorization": "Bearer test-token"}
    app = create_app(config)
    with serve_in_thread(app) as url:
        async with httpx.AsyncClient(base_url=url, headers=auth, timeout=WATCHDOG_S) as http:
            acme, beta = await Tenant(http, "acme").start(), await Tenant(http, "beta").start()
            assert (await acme("run_shell", command="mkfifo stall trap"))["exit_status"] == 0
            ws = app.state.sandbox.sessions["acme"].workspace.root  # a spare's, or its own
            with unblocking(ws / "trap") as fired, unblocking(ws / "stall", 3 * WATCHDOG_S):
                # acme: a run that waits on a FIFO (until released below), and a FIFO read
                stalled = asyncio.create_task(acme("run_shell", command="cat stall"))
                trap = await acme("read_file", path="trap")
                assert (trap["allowed"], trap["rule"]) == (False, "file type")
                # beta, meanwhile: health, a run and file calls all answer
                assert (await http.get("/health")).status_code == 200
                assert (await beta("run_python", code="print(6 * 7)"))["stdout"] == "42\n"
                await beta("write_file", path="b.txt", content="b")
                assert (await beta("read_file", path="b.txt"))["output"]["content"] == "b"
                assert not stalled.done(), "acme's run should still be waiting on its FIFO"
                await release(ws / "stall")
                assert (await stalled)["exit_status"] == 0
            assert fired == []
