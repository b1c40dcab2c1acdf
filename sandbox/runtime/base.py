"""The runtime interface and its result."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sandbox.policy import ResourceClass

TRUNCATED = b"\n[... truncated by the sandbox ...]\n"


@dataclass(slots=True)
class ProcessResult:
    exit_status: int  # negative: killed by that signal
    stdout: bytes
    stderr: bytes
    duration_ms: float
    limit: str | None = None  # "wall_time" | "memory" | "pids" | "cpu" | "output" | "file_size"
    truncated: bool = False
    usage: dict[str, float] = field(default_factory=dict)


class RuntimeUnavailable(Exception):
    """The isolation runtime cannot run here: the service must refuse to run code."""


class Runtime(Protocol):
    name: str

    def check(self) -> None:
        """Raise RuntimeUnavailable when this runtime cannot isolate on this host."""

    async def run(
        self, argv: list[str], workspace: Path, limits: ResourceClass, stdin: bytes = b""
    ) -> ProcessResult: ...
