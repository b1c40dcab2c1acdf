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
def start_stack(log_dir: Path, **embedded: str) -> Iterator[RealStack]:
    """`gearshift serve` on free ports with GEARSHIFT_EMBEDDED__* overrides; stopped on exit."""
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
    }
    log_path = log_dir / "gearshift-serve.log"
    with contextlib.ExitStack() as running:
        running.callback(shutil.rmtree, sandbox_root, ignore_errors=True)  # after the stack
        try:
            stack = running.enter_context(serve(log_path, env, timeout_s=STARTUP_TIMEOUT_S))
        except StackError as exc:
            pytest.fail(str(exc))
        yield RealStack(stack.url, stack.full_url, stack.fast_url, log_path, store_url)


@pytest.fixture(scope="session")
def real_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealStack]:
    """The default stack: the fast tier serves the pruned model (fast_mode: lossy)."""
    with start_stack(tmp_path_factory.mktemp("e2e")) as stack:
        yield stack
