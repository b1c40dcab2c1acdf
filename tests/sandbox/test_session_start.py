"""How a session's sandbox starts: spare warm sandboxes from the pool (handed out once,
refilled, counted against the tenant, stopped at shutdown), the session created by its
first call, run_shell through the session's resident interpreter, and the runner refusing
to run anywhere but inside its sandbox. Real bubblewrap, tmpfs and cgroups throughout."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandbox import pool as pool_module
from sandbox.config import SandboxConfig, WorkspaceQuota
from sandbox.core import Sandbox
from sandbox.errors import SessionNotFound
from sandbox.protocol import Principal, SessionCreate, ToolCall
from sandbox.runtime.warm import WarmPython
from tests.sandbox.conftest import EVERYTHING, WHO, Harness

MIB = 1 << 20


async def until(cond: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def mounts_under(root: Path) -> list[str]:
    lines = Path("/proc/mounts").read_text().splitlines()
    return [p for line in lines if (p := line.split()[1]).startswith(str(root) + "/")]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def pooled(config: SandboxConfig, size: int = 1, **update: object) -> Sandbox:
    sandbox = Sandbox(config.model_copy(update={"warm": True, "pool": size, **update}))
    sandbox.start_pool()
    return sandbox


async def test_a_new_session_gets_a_spare_that_ran_nothing_and_the_pool_refills(
    config: SandboxConfig,
):
    sandbox = pooled(config)
    pool = sandbox.pool
    assert pool is not None
    try:
        await until(lambda: pool.count() == 1)
        spare = pool.ready[EVERYTHING.grant().resources][0]
        runner = spare.warm.proc
        assert runner is not None
        h = Harness(sandbox, "warm")
        session = sandbox.sessions[h.session]
        assert session.warm is spare.warm and session.workspace.root == spare.root
        assert pool.handed_out == 1 and (await sandbox.call(
            "list_dir", ToolCall(principal=WHO, session_id=h.session, arguments={})
        )).output == {"entries": []}  # fmt: skip
        r = await h.py("import os; print(os.getuid(), sorted(os.listdir('/tmp')))")
        assert r.stdout == "65534 []\n", r
        assert session.warm.proc is runner  # the spare's runner answered: none was started
        # Contained like any session: no namespace creation, the grant's memory limit.
        r = await h.sh("unshare -U true; echo $?")
        assert r.stdout.strip() != "0", r
        assert session.warm.cg is not None
        limit = session.warm.cg.dirs.get("memory", session.warm.cg.dirs.get("all"))
        assert limit is not None and any(
            (limit / f).exists() and (limit / f).read_text().strip() == str(128 * MIB)
            for f in ("memory.limit_in_bytes", "memory.max")
        )
        await until(lambda: pool.count() == 1)  # refilled, with another sandbox
        fresh = pool.ready[EVERYTHING.grant().resources][0]
        assert fresh.root != spare.root and fresh.warm.proc is not runner
    finally:
        await sandbox.close()


async def test_a_spare_is_handed_out_once_and_a_used_sandbox_never_comes_back(
    config: SandboxConfig,
):
    sandbox = pooled(config)
    assert sandbox.pool is not None
    try:
        await until(lambda: sandbox.pool is not None and sandbox.pool.count() == 1)
        a = Harness(sandbox, "warm")
        used = sandbox.sessions[a.session]
        assert used.warm is not None and used.warm.proc is not None
        used_pid, used_root = used.warm.proc.pid, used.workspace.root
        r = await a.sh("echo tenant-a > left; echo tenant-a > /tmp/left; (sleep 60 &) ; echo ok")
        assert r.stdout.strip() == "ok", r
        await sandbox.remove(a.session)
        assert not alive(used_pid) and not used_root.exists()
        seen = {id(used.warm)}
        for _ in range(3):  # each new session: a sandbox no one used, never the same one
            await until(lambda: sandbox.pool is not None and sandbox.pool.count() == 1)
            b = Harness(sandbox, "warm")
            s = sandbox.sessions[b.session]
            assert s.warm is not None and id(s.warm) not in seen
            seen.add(id(s.warm))
            assert s.workspace.root != used_root
            r = await b.sh("ls -A; ls -A /tmp; cat left /tmp/left 2>&1; cat /proc/[0-9]*/comm")
            assert "tenant-a" not in r.stdout and "sh\n" in r.stdout, r
            assert "sleep" not in r.stdout, r
        assert sandbox.pool.handed_out == 4
    finally:
        await sandbox.close()


async def test_a_handed_out_spare_counts_against_its_tenants_quota(config: SandboxConfig):
    small = WorkspaceQuota(mb=4, inodes=200, tenant_mb=6, tenant_inodes=300)
    sandbox = pooled(config, size=2, workspace=small)
    assert sandbox.pool is not None
    try:
        await until(lambda: sandbox.pool is not None and sandbox.pool.count() == 2)
        a, b = Harness(sandbox, "warm"), Harness(sandbox, "warm")
        assert sandbox.pool.handed_out == 2
        fill = "for n in 'fghi': open(n, 'wb').write(b'x' * (900 << 10))\nprint('ok')"
        assert (await a.py(fill)).stdout.strip() == "ok"  # 3.5 MiB of the tenant's 6
        r = await b.py(fill)
        assert r.limit == "disk" and "ok" not in r.stdout, r
        await until(lambda: sandbox.pool is not None and sandbox.pool.count() == 2)
        # Spares are nobody's: two idle ones do not shrink a session's room.
        c = Harness(sandbox, "warm")
        await sandbox.remove(a.session)
        await sandbox.remove(b.session)
        assert (await c.py(fill)).stdout.strip() == "ok"
    finally:
        await sandbox.close()


async def test_closing_stops_every_spare_and_start_in_flight(
    config: SandboxConfig, monkeypatch: pytest.MonkeyPatch
):
    started: list[tuple[WarmPython, list[Path]]] = []

    class Recorded(WarmPython):
        async def _start(self) -> None:
            await super()._start()
            assert self.cg is not None
            started.append((self, list(self.cg.dirs.values())))

    monkeypatch.setattr(pool_module, "WarmPython", Recorded)
    sandbox = pooled(config, size=2)
    assert sandbox.pool is not None
    await until(lambda: sandbox.pool is not None and sandbox.pool.count() == 2)
    Harness(sandbox, "warm")  # takes one: a replacement starts
    await until(lambda: len(started) == 3, 5)
    pids = [w.proc.pid for w, _ in started if w.proc is not None]
    await sandbox.close()
    assert sandbox.pool.count() == 0 and sandbox.sessions == {}
    assert all(w.proc is None for w, _ in started)
    assert not any(alive(p) for p in pids)
    assert not any(d.exists() for _, dirs in started for d in dirs)
    assert mounts_under(config.root) == []
    assert sandbox.pool.take(EVERYTHING.grant().resources) is None  # closed: fills nothing


async def test_no_pool_outside_bubblewraps_warm_sessions(config: SandboxConfig):
    assert Sandbox(config.model_copy(update={"warm": False})).pool is None
    assert Sandbox(config.model_copy(update={"pool": 0})).pool is None
    assert Sandbox(config.model_copy(update={"runtime": "gvisor"})).pool is None


async def test_a_call_creates_its_session_for_its_own_tenant_only(config: SandboxConfig):
    sandbox = Sandbox(config)
    try:
        call = ToolCall(principal=WHO, session_id="s1", arguments={"code": "print(1)"},
                        create_session=True)  # fmt: skip
        assert (await sandbox.call("run_python", call)).stdout == "1\n"
        assert sandbox.sessions["s1"].tenant == "acme"
        other = Principal(tenant="beta", key="k")
        with pytest.raises(SessionNotFound):  # another tenant's: not its, not created anew
            await sandbox.call("run_python", call.model_copy(update={"principal": other}))
        with pytest.raises(SessionNotFound):  # without the flag: 404 as before
            await sandbox.call("run_python", call.model_copy(
                update={"session_id": "s2", "create_session": False}))  # fmt: skip
        assert set(sandbox.sessions) == {"s1"}
    finally:
        await sandbox.close()


async def test_warm_run_shell_runs_in_the_sessions_own_sandbox(config: SandboxConfig):
    sandbox = Sandbox(config.model_copy(update={"warm": True}))
    h = Harness(sandbox, "warm")
    try:
        assert (await h.py("open('/tmp/mark', 'w').write('py')")).exit_status == 0
        warm = sandbox.sessions[h.session].warm
        assert warm is not None and warm.proc is not None
        runner = warm.proc.pid
        r = await h.sh("cat /tmp/mark; echo; exit 3")
        assert (r.stdout, r.exit_status) == ("py\n", 3), r
        assert warm.proc is not None and warm.proc.pid == runner
        r = await h.sh("/no/such/program")
        assert r.exit_status == 127 and "not found" in r.stderr, r
    finally:
        await sandbox.close()


async def test_a_warm_call_answers_from_its_childs_report_and_kills_the_child(
    config: SandboxConfig,
):
    """The child reports how its code ended and the runner answers without waiting for
    its exit; a child that ends otherwise (its own ``os._exit``, a signal, a report that
    is no report) is waited for. Each call's child is gone by the next call."""
    sandbox = Sandbox(config.model_copy(update={"warm": True}))
    h = Harness(sandbox, "warm")
    procs = "import os; print(sorted(int(p) for p in os.listdir('/proc') if p.isdigit()))"
    try:
        cases = [
            ("print('hi')", 0, "hi\n"),
            ("raise SystemExit(3)", 3, ""),
            ("raise ValueError('x')", 1, ""),
            ("import os; os._exit(5)", 5, ""),  # no report: the wait status
            ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137, ""),
            ("import os; os.write(4, b'not json'); os.close(4)", 0, ""),  # then the wait's
        ]
        for code, status, stdout in cases:
            r = await h.py(code)
            assert (r.exit_status, r.stdout) == (status, stdout), (code, r)
            assert r.usage.get("cpu_s", 0) > 0, r
            seen = (await h.py(procs)).stdout  # process 1, the runner, this call's child
            assert len(json.loads(seen)) == 3, (code, seen)
    finally:
        await sandbox.close()


async def test_the_childs_rehearsal_leaves_nothing_a_call_can_see(config: SandboxConfig):
    """A pre-forked child compiles and runs a dummy statement before its call (the pages
    that copies are then copied off the call's path; not after a ``run_shell``, whose
    command gains nothing from it): a call's namespace, output and modules are its own
    all the same, on a session's first call, on later ones and after a command."""
    sandbox = Sandbox(config.model_copy(update={"warm": True}))
    h = Harness(sandbox, "warm")
    code = "import sys; print(sorted(globals()), '_' in vars(sys.modules['builtins']))"
    own = (0, "['__builtins__', '__name__', 'sys'] False\n", "")
    try:
        for _ in range(2):
            r = await h.py(code)
            assert (r.exit_status, r.stdout, r.stderr) == own, r
        assert ((await h.sh("echo 1")).stdout, (await h.sh("true")).stdout) == ("1\n", "")
        r = await h.py(code)
        assert (r.exit_status, r.stdout, r.stderr) == own, r
        assert (await h.py("pass")).stdout == ""
    finally:
        await sandbox.close()


def test_the_runner_refuses_to_run_outside_its_sandbox():
    """Its sweep kills every process it can see: on a host, that would be all of them.
    Tried in a pid namespace of its own, so that a regression kills nothing else."""
    source = Path(sys.modules[WarmPython.__module__].__file__ or "").with_name("warm_runner.py")
    request = b"\0\0\0\2{}"
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "/usr/bin/python3", "-I", str(source)],
        input=request, capture_output=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 1 and b"refusing to run outside the sandbox" in done.stderr


async def test_sessions_made_with_post_get_spares_too(config: SandboxConfig):
    sandbox = pooled(config)
    try:
        await until(lambda: sandbox.pool is not None and sandbox.pool.count() == 1)
        s = sandbox.create(SessionCreate(principal=WHO, session_id="named"))
        assert s.warm is not None and s.warm.running
        none = sandbox.create(SessionCreate(principal=Principal(tenant="nobody", key="k")))
        assert none.warm is None  # no grant for the process tools: no spare, no runner
    finally:
        await sandbox.close()
