"""Warm sandboxes: one resident interpreter per session, inside the same isolation.

The first ``run_python`` or ``run_shell`` of a session starts ``warm_runner`` (or a pool
started it before the session existed: ``sandbox.pool``) under
bubblewrap + seccomp + rlimits in a cgroup of the session's own (memory, pids and CPU
limits apply to the session); each call sends it code (or a command to exec) and it forks
a fresh child per call (see ``warm_runner``), with the call's CPU limit, wall time and
output cap; what a call leaves running is killed before the reply. A call's usage is the
kernel's, from the session's call cgroup (``call_usage``), with the child's own report as
``reported_cpu_s`` beside it, and in its place where the call cgroup could not be made or
the child not moved into it. A runner that dies or
stops answering is killed with its cgroup and started again on the next call. Calls within
a session run one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
import uuid
from concurrent.futures import Future
from dataclasses import replace
from importlib import resources
from pathlib import Path

import orjson

from sandbox.policy import ResourceClass
from sandbox.runtime import seccomp
from sandbox.runtime.base import TRUNCATED, ProcessResult, RuntimeUnavailable, launch
from sandbox.runtime.bwrap import BwrapRuntime
from sandbox.runtime.call_usage import WAIT_FOR_MOVE_S, CallCgroup
from sandbox.runtime.cgroups import Cgroup

SOURCE = resources.files("sandbox.runtime").joinpath("warm_runner.py").read_text()
HEADER = struct.Struct(">I")
UNLIMITED_CPU = 10**9  # the runner's own rlimit; each call's child sets its own


class WarmPython:
    def __init__(
        self,
        runtime: BwrapRuntime,
        workspace: Path,
        limits: ResourceClass,
        kernel_usage: bool = False,
    ) -> None:
        self.runtime, self.workspace, self.limits = runtime, workspace, limits
        self.proc: asyncio.subprocess.Process | None = None
        self.cg: Cgroup | None = None
        self.calls: CallCgroup | None = None  # None: usage is the child's own report
        self.kernel_usage = kernel_usage  # sandbox.kernel_usage: make the call cgroup
        self.ooms = 0  # the cgroup's OOM kills as last read: one read per call, after it
        self.lock = asyncio.Lock()
        # The runner's announcement of its next child, read; then that child's move, in a
        # mover thread (``call_usage``): its result is True once the child was moved.
        self._forked: asyncio.Task[Future[bool] | None] | None = None
        self._announces = False  # the runner announces its children (it has a call cgroup)

    async def _start(self) -> None:
        session_limits = replace(self.limits, cpu_s=UNLIMITED_CPU)
        self.cg = Cgroup("warm-" + uuid.uuid4().hex[:16], self.limits, nested=self.kernel_usage)
        self.ooms = 0
        self.calls = None
        if self.kernel_usage:
            with contextlib.suppress(RuntimeUnavailable):  # the child's report, then
                self.calls = CallCgroup(self.cg)
        with seccomp.filter_file() as bpf:
            argv = ["/usr/bin/python3", "-I", "-c", SOURCE]
            self._announces = self.calls is not None  # which child to move into it
            if self._announces:
                argv.append("announce")
            cmd = self.runtime.command(argv, self.workspace, session_limits, self.cg, bpf.fileno())
            # The runner's environment and descriptors are the cold chain's (``launch``); its
            # stderr goes nowhere, each call's child gets pipes of its own.
            self.proc = await launch(
                cmd, pass_fds=[bpf.fileno()], stderr=asyncio.subprocess.DEVNULL
            )
        self._follow_fork()  # its first child, once it is up

    def _follow_fork(self) -> None:
        """Read the runner's announcement of the child it forks next and move that child
        into the call cgroup, in the background (the runner forks after each answer)."""
        if not self._announces:
            return
        self._forked = asyncio.get_running_loop().create_task(self._next_child())

    async def _next_child(self) -> Future[bool] | None:
        proc, calls = self.proc, self.calls
        assert proc is not None and proc.stdout is not None
        child = (await self._read(proc.stdout)).get("forked")
        if calls is None or not isinstance(child, int):
            return None
        # Handed to a mover thread without waiting for it here: the event loop learns the
        # outcome when the call asks (most often done by then: no wake-up for it).
        return calls.move_soon(proc.pid, child)

    async def _admit(self) -> bool:
        """Wait until the next child's announcement was read (the stream is then the
        call's), and at most ``WAIT_FOR_MOVE_S`` for its move. Whether the call is counted
        in the call cgroup (else its usage is the child's own report: a move that ends
        later moves a child that is already running the call)."""
        task, self._forked = self._forked, None
        if task is None:
            return False
        moving = await task  # written right after the fork: at once, or at the runner's start
        if moving is None:
            return False
        if not moving.done():
            await asyncio.wait({asyncio.wrap_future(moving)}, timeout=WAIT_FOR_MOVE_S)
            if not moving.done():
                return False
        return moving.result() and self.calls is not None and self.calls.begin()

    async def prestart(self, timeout_s: float = 30.0) -> bool:
        """Start the runner and wait until it answers (a pool's spare, before any call).
        False (and nothing left running) when it did not come up."""
        async with self.lock:
            await self._start()
            try:
                async with asyncio.timeout(timeout_s):
                    if self._forked is not None:  # its first child's announcement
                        await asyncio.wait({self._forked})
                        self._forked.result()
                    reply = await self._exchange(orjson.dumps({"ping": True}))
                if reply.get("pong") is True:
                    return True
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
                pass
            await self.stop()
            return False

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def _exchange(self, body: bytes) -> dict[str, object]:
        assert self.proc is not None and self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(HEADER.pack(len(body)) + body)
        await self.proc.stdin.drain()
        return await self._read(self.proc.stdout)

    @staticmethod
    async def _read(stream: asyncio.StreamReader) -> dict[str, object]:
        (size,) = HEADER.unpack(await stream.readexactly(HEADER.size))
        frame: dict[str, object] = orjson.loads(await stream.readexactly(size))
        return frame

    async def run(
        self, code: str, stdin: bytes, limits: ResourceClass, argv: list[str] | None = None
    ) -> ProcessResult:
        """Run ``code`` (Python) in a fresh child of the runner, or exec ``argv`` there."""
        async with self.lock:
            if not self.running:
                await self.stop()
                await self._start()
            assert self.proc is not None and self.cg is not None
            oom_before = self.ooms
            request = {"code": code, "argv": argv, "stdin": stdin.decode("latin-1"),
                       "cpu_s": limits.cpu_s, "wall_s": limits.wall_s,
                       "output_bytes": limits.output_bytes}  # fmt: skip
            started = time.perf_counter()
            try:
                async with asyncio.timeout(limits.wall_s + 5):
                    counted = await self._admit()
                    reply = await self._exchange(orjson.dumps(request))
            except (TimeoutError, asyncio.IncompleteReadError, ConnectionError) as exc:
                # The runner itself died (OOM, a call killed it) or hung: start over next time.
                oom = self._oom_kills() > oom_before
                await self.stop()
                return ProcessResult(
                    exit_status=137, stdout=b"", stderr=f"sandbox runner lost: {exc!r}".encode(),
                    duration_ms=(time.perf_counter() - started) * 1000,
                    limit="memory" if oom else "wall_time" if isinstance(exc, TimeoutError) else None,
                )  # fmt: skip
            self.ooms = self._oom_kills()
            result = self._result(reply, limits, self.ooms > oom_before)
            if counted and self.calls is not None:
                result.usage = self._kernel_usage(result.usage, self.calls.usage())
            self._follow_fork()  # the runner forks the next child now
            return result

    def _oom_kills(self) -> int:
        assert self.cg is not None
        return self.cg.oom_kills() + (self.calls.oom_kills() if self.calls is not None else 0)

    @staticmethod
    def _kernel_usage(reported: dict[str, float], kernel: dict[str, float]) -> dict[str, float]:
        """The kernel's figures over the child's report, which stays as ``reported_cpu_s``
        (a cross-check: it includes the child's set-up before its call, and misses what the
        call forked and did not wait for)."""
        usage = {**reported, **kernel}
        if "cpu_s" in reported:
            usage["reported_cpu_s"] = reported["cpu_s"]
        return usage

    @staticmethod
    def _result(reply: dict[str, object], limits: ResourceClass, oom: bool) -> ProcessResult:
        out = str(reply["stdout"]).encode("latin-1")
        err = str(reply["stderr"]).encode("latin-1")
        truncated = bool(reply["truncated"])
        status = int(reply["exit_status"])  # type: ignore[call-overload]
        limit = reply["limit"] or ("memory" if oom else None)
        if limit is None and status in (128 + 24, 128 + 9) and not oom:
            limit = "cpu" if status == 128 + 24 else None
        if limit is None and status == 128 + 25:
            limit = "file_size"
        if limit is None and truncated:
            limit = "output"
        return ProcessResult(
            exit_status=status, stdout=out + TRUNCATED if truncated and len(out) >= limits.output_bytes else out,
            stderr=err + TRUNCATED if truncated and len(err) >= limits.output_bytes else err,
            duration_ms=float(reply["duration_ms"]),  # type: ignore[arg-type]
            limit=str(limit) if limit else None, truncated=truncated,
            usage=dict(reply.get("usage") or {}),  # type: ignore[call-overload]
        )  # fmt: skip

    async def stop(self) -> None:
        proc, cg = self.proc, self.cg
        self.proc = self.cg = None
        if (task := self._forked) is not None:
            self._forked = None
            task.cancel()
            if task.done() and not task.cancelled():
                task.exception()  # the runner's end, seen: its stream closed
        if self.calls is not None:
            self.calls.close()
            self.calls = None
        if proc is not None and proc.returncode is None:
            if proc.stdin is not None:
                proc.stdin.close()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 1)
        if cg is not None:
            await asyncio.to_thread(cg.kill, proc.pid if proc and proc.returncode is None else None)
            if proc is not None and proc.returncode is None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 5)
            await asyncio.to_thread(cg.remove)
