"""``gearshift serve`` runs the tool sandbox as a child process on a Unix socket.

The sandbox (``python -m sandbox``, its own entry point: the gateway imports only the
sandbox's client, protocol and configuration) gets the ``sandbox`` section of the
configuration (written to a private file), a token (the configured one, or a fresh random
one), and dies with the gateway (PR_SET_PDEATHSIG), even on ``kill -9``. Where it cannot
isolate (not root, no bubblewrap) it refuses to start, says why, and the gateway goes on
without it: tools never run unsandboxed.

It inherits nothing it is not given: its environment is the few variables named in
``PASSED_ENV`` (the gateway's own — store URLs, keys, tokens — stay with the gateway), and
no descriptor but its standard streams.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

import aiohttp
import yaml

from backends.supervisor import die_with_parent
from gateway.config import Settings
from sandbox.config import SandboxConfig

# python -m sandbox's exit status when it refuses to run code (no isolation, root in use)
CANNOT_ISOLATE = 3
# All the sandbox service needs of the gateway's environment: PATH to find bwrap, prlimit,
# setpriv and runsc; PYTHONPATH where that is how this package is found; the rest is locale,
# home and temporary directory. Everything else it is told goes through its config file.
PASSED_ENV = ("PATH", "PYTHONPATH", "LANG", "HOME", "TMPDIR")

log = logging.getLogger("gearshift")


class SandboxProcess:
    def __init__(self, proc: asyncio.subprocess.Process, socket: Path, token: str, config: Path):
        self.proc, self.socket, self.token, self._config = proc, socket, token, config

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        for path in (self._config, self.socket):  # uvicorn leaves its Unix socket behind
            with contextlib.suppress(OSError):
                path.unlink()


def write_section(config: SandboxConfig, **override: str) -> Path:
    """The ``sandbox`` section as a private YAML file (mode 0600: the token is in it).

    The token is written as itself: a plain dump writes a ``SecretStr`` as ``**********``,
    which would make that string the service's shared secret."""
    section = config.model_dump(mode="json")
    section["token"] = config.token.get_secret_value() if config.token is not None else None
    section |= override
    fd, name = tempfile.mkstemp(prefix="gearshift-sandbox-", suffix=".yaml")
    with os.fdopen(fd, "w") as f:
        yaml.safe_dump({"sandbox": section}, f)
    return Path(name)


def command(config_file: Path, log_level: str = "warning") -> list[str]:
    return [sys.executable, "-m", "sandbox", "--config", str(config_file), "--log-level", log_level]


def environment(source: Mapping[str, str] | None = None) -> dict[str, str]:
    """The sandbox service's whole environment: the ``PASSED_ENV`` variables of ``source``
    (the gateway's environment by default) that are set, and nothing else."""
    source = os.environ if source is None else source
    return {name: source[name] for name in PASSED_ENV if name in source}


async def start_sandbox(settings: Settings, timeout_s: float = 20.0) -> SandboxProcess | None:
    cfg = settings.sandbox
    if not cfg.enabled:
        return None
    token = cfg.token.get_secret_value() if cfg.token else secrets.token_urlsafe(32)
    socket = cfg.socket or settings.embedded.home / f"sandbox-{settings.port}.sock"
    socket.parent.mkdir(parents=True, exist_ok=True)
    config_file = write_section(cfg, token=token, socket=str(socket))
    proc = await asyncio.create_subprocess_exec(
        *command(config_file), env=environment(), close_fds=True, preexec_fn=die_with_parent
    )
    sandbox = SandboxProcess(proc, socket, token, config_file)
    if await _healthy(socket, proc, timeout_s):
        log.info("tool sandbox ready on unix:%s", socket)
        return sandbox
    await sandbox.stop()
    if proc.returncode == CANNOT_ISOLATE:
        log.warning("tool sandbox not started: it refused to run code here (its reason is "
                    "above: no isolation, or its root in use); tools cannot run until it can")  # fmt: skip
    else:
        log.error("tool sandbox did not start (exit status %s); tools cannot run", proc.returncode)
    return None


async def _healthy(socket: Path, proc: asyncio.subprocess.Process, timeout_s: float) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while asyncio.get_running_loop().time() < deadline and proc.returncode is None:
        with contextlib.suppress(aiohttp.ClientError, OSError):
            async with (
                aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(socket))) as s,
                s.get("http://sandbox/health") as r,
            ):
                if r.status == 200:
                    return True
        await asyncio.sleep(0.1)
    return False


async def check_external(cfg: SandboxConfig, timeout_s: float | None = None) -> str | None:
    """``sandbox.external`` at start-up: None when the service answers ``/health`` and takes
    the token (an authorized ``GET /v1/tools``), else what is wrong. An unreachable service
    is retried for ``sandbox.external_wait_s`` (it may start after the gateway); a refused
    token fails at once."""
    assert cfg.external is not None and cfg.token is not None
    url, wait = cfg.external, cfg.external_wait_s if timeout_s is None else timeout_s
    headers = {"authorization": f"Bearer {cfg.token.get_secret_value()}"}
    loop = asyncio.get_running_loop()
    deadline, last = loop.time() + wait, "no answer"
    timeout = aiohttp.ClientTimeout(total=5)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while True:
            try:
                async with session.get(f"{url}/health") as health:
                    if health.status != 200:
                        raise _NotYet(f"/health answered {health.status}")
                async with session.get(f"{url}/v1/tools", headers=headers) as tools:
                    if tools.status in (401, 403):
                        return (f"sandbox.external {url} refused the token: sandbox.token must "
                                "be the one the sandbox service was given")  # fmt: skip
                    if tools.status != 200:
                        raise _NotYet(f"GET /v1/tools answered {tools.status}")
                log.info("tool sandbox at %s ready", url)
                return None
            except (aiohttp.ClientError, TimeoutError, _NotYet) as exc:
                last = str(exc) or type(exc).__name__
            if loop.time() >= deadline:
                return (f"sandbox.external {url} did not answer within {wait:g} s ({last}): "
                        "start the sandbox service (`gearshift sandbox`) or fix the URL")  # fmt: skip
            await asyncio.sleep(min(0.5, max(0.0, deadline - loop.time())))


class _NotYet(Exception):
    """The external sandbox answered, but not yet as a ready service."""
