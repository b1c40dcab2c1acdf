"""The real embedded stack: `gearshift serve` with two vLLM servers and the default model."""

from __future__ import annotations

import contextlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from bench.stack import StackError, serve
from tests.support.mcp_server import demo_server
from tests.support.servers import serve_in_thread

STARTUP_TIMEOUT_S = 900


@dataclass
class RealStack:
    url: str
    full_url: str
    fast_url: str
    log_path: Path
    store_url: str

    def client(self, **kw) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=120, **kw
        )


@contextlib.contextmanager
def start_stack(
    log_dir: Path, extra_env: dict[str, str] | None = None, **embedded: str
) -> Iterator[RealStack]:
    """`gearshift serve` on free ports with GEARSHIFT_EMBEDDED__* overrides (and any other
    ``extra_env``); stopped on exit."""
    store_url = f"sqlite:///{log_dir}/trajectories.db"
    # a sandbox root of its own: a sandbox service clears the workspaces it finds under its
    # root when it starts, so a second stack on the default root would remove the first's
    # (its pre-started spares included) while both run
    sandbox_root = Path(tempfile.mkdtemp(prefix="gearshift-e2e-sandbox-"))
    sandbox_root.chmod(0o755)  # the unprivileged user tool code runs as passes through it
    env = {
        "GEARSHIFT_EMBEDDED__MAX_RESTARTS": "2",
        "GEARSHIFT_TELEMETRY__SCRAPE_INTERVAL_S": "1",
        "GEARSHIFT_STORE__URL": store_url,
        "GEARSHIFT_STORE__DEAD_LETTER_PATH": str(log_dir / "dead-letter.jsonl"),
        "GEARSHIFT_SANDBOX__ROOT": str(sandbox_root),
        # the anonymous caller's tenant may run Python in the embedded sandbox (deny by
        # default otherwise): the hosted code_interpreter of test_responses_real.py
        "GEARSHIFT_SANDBOX__GRANTS_BY_TENANT": json.dumps({"default": {"tools": ["run_python"]}}),
        **{f"GEARSHIFT_EMBEDDED__{k.upper()}": v for k, v in embedded.items()},
        **(extra_env or {}),
    }
    log_path = log_dir / "gearshift-serve.log"
    with contextlib.ExitStack() as running:
        running.callback(shutil.rmtree, sandbox_root, ignore_errors=True)  # after the stack
        try:
            stack = running.enter_context(serve(log_path, env, timeout_s=STARTUP_TIMEOUT_S))
        except StackError as exc:
            pytest.fail(str(exc))
        yield RealStack(stack.url, stack.full_url, stack.fast_url, log_path, store_url)


# The default tenant of the session's stack may also write and read workspace files, and a
# write (risk class "mutating") waits for a human approval (test_responses_agent.py).
AGENT_GRANT = {
    "tools": ["run_python", "write_file", "read_file"], "read": ["*"], "write": ["*"],
    "approval": ["mutating"],
}  # fmt: skip


@pytest.fixture(scope="session")
def mcp_url() -> Iterator[str]:
    """A real MCP server (the ``mcp`` SDK's, streamable HTTP on loopback) for the session."""
    with serve_in_thread(demo_server()) as url:
        yield url + "/mcp"


@pytest.fixture(scope="session")
def real_stack(tmp_path_factory: pytest.TempPathFactory, mcp_url: str) -> Iterator[RealStack]:
    """The default stack: the fast tier serves the pruned model (fast_mode: lossy); its
    operator allows the session's MCP server (label ``demo``) for every tenant; the context
    ladder's summaries are the fast tier's (the default is the extractive summary, which the
    integration tests cover: here a real model writes one, end to end)."""
    env = {
        "GEARSHIFT_CONTEXT__SUMMARIZER": "fast",
        "GEARSHIFT_SANDBOX__GRANTS_BY_TENANT": json.dumps({"default": AGENT_GRANT}),
        "GEARSHIFT_RESPONSES__MCP__SERVERS": json.dumps(
            [{"label": "demo", "url": mcp_url, "tenants": ["*"]}]
        ),
    }
    with start_stack(tmp_path_factory.mktemp("e2e"), env) as stack:
        yield stack
