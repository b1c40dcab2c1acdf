"""A real sandbox (bubblewrap + seccomp + cgroups) with a permissive grant, for the attacks."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from sandbox.config import GrantConfig, Resources, SandboxConfig
from sandbox.core import Sandbox
from sandbox.protocol import Principal, SessionCreate, ToolCall, ToolResult
from sandbox.workspace import sweep

EVERYTHING = GrantConfig(
    tools=["run_python", "run_shell", "read_file", "write_file", "list_dir"],
    read=["*"],
    write=["*"],
    resources=Resources(cpu_s=2, memory_mb=128, pids=32, wall_s=5, output_bytes=4096, file_mb=1),
)
WHO = Principal(tenant="acme", key="k1")


@pytest.fixture
def config(sandbox_root: Path) -> Iterator[SandboxConfig]:
    if os.geteuid() != 0 or shutil.which("bwrap") is None:
        pytest.fail("the sandbox tests need root and bubblewrap: run ./scripts/install.sh")
    yield SandboxConfig(
        token="test-token", root=sandbox_root, grants_by_tenant={"acme": EVERYTHING}
    )
    sweep(sandbox_root)  # workspaces are mounts: a test that left sessions must not leak them


class Harness:
    def __init__(self, sandbox: Sandbox, kind: str = "cold") -> None:
        self.sandbox = sandbox
        self.kind = kind  # warm | cold | gvisor
        self.gvisor = kind == "gvisor"
        self.session = sandbox.create(SessionCreate(principal=WHO)).id

    async def __call__(self, tool: str, **arguments: object) -> ToolResult:
        return await self.sandbox.call(
            tool, ToolCall(principal=WHO, session_id=self.session, arguments=arguments)
        )

    async def sh(self, command: str) -> ToolResult:
        return await self("run_shell", command=command)

    async def py(self, code: str) -> ToolResult:
        return await self("run_python", code=code)


@pytest.fixture(params=["warm", "cold", "gvisor"])
async def sbx(request: pytest.FixtureRequest, config: SandboxConfig) -> AsyncIterator[Harness]:
    """Every attack runs three times: bubblewrap warm (resident interpreter) and cold, and
    under gVisor."""
    if request.param == "gvisor" and shutil.which("runsc") is None:
        pytest.fail("gVisor (runsc) is not installed: run ./scripts/install.sh")
    update = {
        "warm": request.param == "warm",
        "runtime": "gvisor" if request.param == "gvisor" else "bwrap",
    }
    sandbox = Sandbox(config.model_copy(update=update))
    yield Harness(sandbox, request.param)
    await sandbox.close()
