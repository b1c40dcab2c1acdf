"""The runtime interface and its result, and what every runtime launches processes with.

Nothing of the service reaches a run: ``launch`` starts a runtime's launcher (``sh`` →
``prlimit`` → ``setpriv`` → ``bwrap``, or ``runsc``) with ``RUN_ENV`` as its whole
environment and no descriptor but its pipes and the ones it names. That matters past
``bwrap --clearenv``: bubblewrap's process 1 inside the sandbox keeps the environment it
was started with, and code in the sandbox can read it from ``/proc/1/environ``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Protocol

from sandbox.errors import RuntimeUnavailable as RuntimeUnavailable
from sandbox.policy import ResourceClass

TRUNCATED = b"\n[... truncated by the sandbox ...]\n"

# A run's whole environment, and its launchers' too (so process 1 has nothing else).
RUN_ENV: Mapping[str, str] = MappingProxyType(
    {"PATH": "/usr/bin:/bin", "HOME": "/workspace", "LANG": "C.UTF-8",
     "PYTHONDONTWRITEBYTECODE": "1"}
)  # fmt: skip


async def launch(
    argv: Sequence[str], *, pass_fds: Collection[int] = (), stderr: int = asyncio.subprocess.PIPE
) -> asyncio.subprocess.Process:
    """Start a sandbox launcher holding nothing of the service's: ``RUN_ENV`` as its
    environment, only its pipes (stdin, stdout, ``stderr``) and ``pass_fds`` open, ``/``
    as its directory (not the service's), in a session of its own. ``argv[0]`` must be an
    absolute path (no lookup in the service's ``PATH``)."""
    return await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
        env=dict(RUN_ENV), cwd="/", close_fds=True, pass_fds=tuple(pass_fds),
        start_new_session=True,
    )  # fmt: skip


@dataclass(slots=True)
class ProcessResult:
    exit_status: int  # negative: killed by that signal
    stdout: bytes
    stderr: bytes
    duration_ms: float
    limit: str | None = None  # "wall_time" | "memory" | "pids" | "cpu" | "output" | "file_size"
    truncated: bool = False
    usage: dict[str, float] = field(default_factory=dict)


class Runtime(Protocol):
    name: str

    def check(self) -> None:
        """Raise RuntimeUnavailable when this runtime cannot isolate on this host."""

    async def run(
        self, argv: list[str], workspace: Path, limits: ResourceClass, stdin: bytes = b""
    ) -> ProcessResult: ...


class Capped:
    """Keeps the first ``cap`` bytes of a stream and notes that there was more."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.chunks: list[bytes] = []
        self.kept = 0
        self.truncated = False

    async def drain(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            room = self.cap - self.kept
            if room > 0:
                self.chunks.append(chunk[:room])
                self.kept += min(room, len(chunk))
            if len(chunk) > room:
                self.truncated = True

    def value(self) -> bytes:
        data = b"".join(self.chunks)
        return data + TRUNCATED if self.truncated else data


class Streams:
    """A sandboxed process's stdin written and its stdout/stderr read, capped."""

    def __init__(self, proc: asyncio.subprocess.Process, cap: int) -> None:
        assert proc.stdin and proc.stdout and proc.stderr
        self.proc = proc
        self.out, self.err = Capped(cap), Capped(cap)
        self._readers = asyncio.gather(self.out.drain(proc.stdout), self.err.drain(proc.stderr))

    @property
    def truncated(self) -> bool:
        return self.out.truncated or self.err.truncated

    async def run(self, stdin: bytes, wall_s: float) -> bool:
        """Feed stdin, read until the process ends; False when the wall time ran out."""
        await self._feed(stdin)
        try:
            async with asyncio.timeout(wall_s):
                await self._readers
                await self.proc.wait()
            return True
        except TimeoutError:
            return False

    async def _feed(self, stdin: bytes) -> None:
        """Write ``stdin`` and close the pipe. The process may have ended and its pipe
        closed already (a quick run, under load): uvloop then refuses a write with a
        RuntimeError, not a broken pipe, so a closing pipe is not written to at all."""
        pipe = self.proc.stdin
        assert pipe is not None
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            if stdin and not pipe.is_closing():
                pipe.write(stdin)
                await pipe.drain()
        pipe.close()

    async def close(self) -> None:
        """Stop reading (after the process tree was killed)."""
        self._readers.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._readers
