"""Start, readiness-check, restart and stop the vLLM servers as child processes.

Each server runs in its own process group (so a stop takes its engine
processes too) and gets SIGKILL from the kernel if the supervising process
dies, even by ``kill -9`` (PR_SET_PDEATHSIG), so no orphan keeps a core busy.
A server that dies is restarted with backoff up to ``max_restarts`` times; after
that it is reported FAILED and left down, and the gateway's health checks eject
it from its tier.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path

import aiohttp

from backends.vllm_server import VllmServerSpec, command, environment

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class ServerState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPED = "stopped"


class SupervisorError(RuntimeError):
    """A server failed to become ready or died too often."""


@dataclass
class Managed:
    spec: VllmServerSpec
    argv: list[str]
    log_path: Path
    state: ServerState = ServerState.STARTING
    restarts: int = 0
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    last_exit: int | None = None
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    # vLLM's ZeroMQ sockets (VLLM_RPC_BASE_PATH): a folder of this server's, removed when it
    # stops, instead of a socket per start left in the machine's temporary folder
    rpc_dir: Path | None = None


SOCKET_PATH_MAX = 107  # bytes of a Unix socket's path (sun_path less its terminating NUL)
UUID_NAME = 1 + 36  # "/" and the uuid4 vLLM names each socket by


def rpc_folder(name: str) -> Path:
    """A private (0700) folder for a vLLM server's ZeroMQ sockets, in the temporary folder,
    or in /tmp when that one's path is too long for a socket under it."""
    base = tempfile.gettempdir()
    prefix = f"gearshift-vllm-{name[:16]}-"
    if len(os.fsencode(base)) + 1 + len(prefix) + 8 + UUID_NAME > SOCKET_PATH_MAX:
        base = "/tmp"
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 8192))
            return "\n".join(fh.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Supervisor:
    def __init__(
        self,
        specs: list[VllmServerSpec],
        *,
        python: Path,
        log_dir: Path,
        startup_timeout_s: float = 600.0,
        max_restarts: int = 3,
        base_env: Mapping[str, str] | None = None,
        argv_for: Callable[[VllmServerSpec, Path], list[str]] = command,
        ready_path: str = "/health",
    ) -> None:
        self._python = python
        self._log_dir = log_dir
        self._startup_timeout_s = startup_timeout_s
        self._max_restarts = max_restarts
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._ready_path = ready_path
        self._servers = {
            # The port is in the name: two stacks may share a cache folder.
            s.name: Managed(s, argv_for(s, python), log_dir / f"vllm-{s.name}-{s.port}.log")
            for s in specs
        }
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = False

    @property
    def servers(self) -> Mapping[str, Managed]:
        return self._servers

    def states(self) -> dict[str, ServerState]:
        return {name: m.state for name, m in self._servers.items()}

    async def start(self) -> None:
        self._log_dir.mkdir(parents=True, exist_ok=True)
        for managed in self._servers.values():
            await self._spawn(managed)
            self._tasks.append(
                asyncio.create_task(self._watch(managed), name=f"watch-{managed.spec.name}")
            )

    async def _spawn(self, m: Managed) -> None:
        m.ready.clear()
        m.started_at = time.monotonic()
        if m.rpc_dir is not None:  # a restart: the dead process group's sockets
            shutil.rmtree(m.rpc_dir, ignore_errors=True)
        m.rpc_dir = rpc_folder(m.spec.name)
        env = environment(m.spec, self._base_env)
        env["VLLM_RPC_BASE_PATH"] = str(m.rpc_dir)
        with m.log_path.open("ab") as out:
            m.process = await asyncio.create_subprocess_exec(
                *m.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,
            )
        log.info(
            "started vLLM %s (pid %d) on %s, log %s",
            m.spec.name,
            m.process.pid,
            m.spec.base_url,
            m.log_path,
        )

    async def _probe(self, session: aiohttp.ClientSession, m: Managed) -> bool:
        try:
            async with session.get(m.spec.base_url + self._ready_path) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def _wait_ready_or_exit(self, m: Managed) -> int | None:
        """Poll until the server answers (returns None) or its process exits (returns the code)."""
        assert m.process is not None
        timeout = aiohttp.ClientTimeout(total=2)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while m.process.returncode is None:
                if await self._probe(session, m):
                    return None
                if time.monotonic() - m.started_at > self._startup_timeout_s:
                    log.error(
                        "vLLM %s not ready after %.0fs; killing it",
                        m.spec.name,
                        self._startup_timeout_s,
                    )
                    self._kill(m, signal.SIGKILL)
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(m.process.wait(), 1.0)
        return await m.process.wait()

    async def _watch(self, m: Managed) -> None:
        while not self._stopping:
            code = await self._wait_ready_or_exit(m)
            if code is None:
                m.state = ServerState.READY
                m.ready.set()
                log.info("vLLM %s ready after %.1fs", m.spec.name, time.monotonic() - m.started_at)
                assert m.process is not None
                code = await m.process.wait()
            if self._stopping:
                return
            # The API process is gone, but its engine and worker processes may not be (a
            # SIGKILL or a crash does not take them): end the whole group before restarting.
            self._kill(m, signal.SIGKILL)
            m.last_exit = code
            m.ready.set()  # wake waiters; they look at the state
            if m.restarts >= self._max_restarts:
                m.state = ServerState.FAILED
                log.error(
                    "vLLM %s exited with %s and will not be restarted (%d restarts); last log lines:\n%s",
                    m.spec.name,
                    code,
                    m.restarts,
                    log_tail(m.log_path),
                )
                return
            m.restarts += 1
            m.state = ServerState.RESTARTING
            delay = min(2.0**m.restarts, 30.0)
            log.warning(
                "vLLM %s exited with %s; restart %d/%d in %.0fs; last log lines:\n%s",
                m.spec.name,
                code,
                m.restarts,
                self._max_restarts,
                delay,
                log_tail(m.log_path),
            )
            await asyncio.sleep(delay)
            if self._stopping:
                return
            await self._spawn(m)

    async def wait_ready(self, on_wait: Callable[[str, float], None] | None = None) -> None:
        """Wait until every server is READY; raise SupervisorError if one FAILED."""
        pending = dict(self._servers)
        while pending:
            for name, m in list(pending.items()):
                if m.state is ServerState.READY:
                    del pending[name]
                elif m.state is ServerState.FAILED:
                    raise SupervisorError(
                        f"vLLM {name} failed to start (exit {m.last_exit}); log {m.log_path}:\n{log_tail(m.log_path)}"
                    )
            if pending and on_wait is not None:
                for name, m in pending.items():
                    on_wait(name, time.monotonic() - m.started_at)
            if pending:
                await asyncio.sleep(1.0)

    def _kill(self, m: Managed, sig: signal.Signals) -> None:
        # The whole group: vLLM's engine processes outlive a dead API process otherwise.
        if m.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(m.process.pid, sig)

    async def stop(self, grace_s: float = 10.0) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for m in self._servers.values():
            self._kill(m, signal.SIGTERM)
        for m in self._servers.values():
            if m.process is None:
                continue
            try:
                await asyncio.wait_for(m.process.wait(), grace_s)
            except TimeoutError:
                self._kill(m, signal.SIGKILL)
                await m.process.wait()
            m.state = ServerState.STOPPED
        for m in self._servers.values():
            if m.rpc_dir is not None:
                shutil.rmtree(m.rpc_dir, ignore_errors=True)
                m.rpc_dir = None
        await asyncio.gather(*self._tasks, return_exceptions=True)
