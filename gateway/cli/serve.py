"""``gearshift serve``: the gateway, and with no tiers configured the embedded stack under it.

Order of start-up: provision and start the vLLM servers (embedded only), start the gateway
at once (``/health`` answers, ``/ready`` says not yet), wait for the servers, check that the
tiers are one model family, then say ``Gearshift ready``. On SIGINT/SIGTERM the gateway
drains first, then the vLLM servers are stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator
from typing import Any

import aiohttp
import uvicorn
from pydantic import SecretStr

from backends.supervisor import Supervisor, SupervisorError
from gateway.config import Settings
from gateway.http.app import create_app
from gateway.upstream.family_probe import check_replica_family

log = logging.getLogger("gearshift")


class _Server(uvicorn.Server):
    """uvicorn's server, minus its signal capture: `serve` must stop the vLLM
    servers after the gateway, and uvicorn would re-raise the signal first."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _start_embedded(settings: Settings) -> tuple[Settings, Supervisor] | None:
    from backends.family import FamilyMismatch
    from backends.provision import ProvisionError
    from gateway.cli.embedded import build_stack, router_mismatches

    log.info(
        "no tiers configured: starting the embedded default stack under %s", settings.embedded.home
    )
    try:
        stack = await asyncio.to_thread(build_stack, settings.embedded)
    except (ProvisionError, FamilyMismatch) as exc:
        log.error("%s", exc)
        return None
    for warning in router_mismatches(settings.router, settings.embedded):
        log.warning("%s", warning)
    await stack.supervisor.start()
    return settings.model_copy(update={"tiers": stack.tiers}), stack.supervisor


async def _await_servers(supervisor: Supervisor, serving: asyncio.Task[None]) -> str | None:
    """Wait for every vLLM server; an error message if one failed."""
    last_note: dict[str, int] = {}

    def note(name: str, waited: float) -> None:
        if int(waited) // 15 != last_note.get(name, -1):
            last_note[name] = int(waited) // 15
            log.info("waiting for vLLM %s to load the model (%.0fs)", name, waited)

    waiter = asyncio.create_task(supervisor.wait_ready(note))
    await asyncio.wait({serving, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if not waiter.done():
        waiter.cancel()
        return None
    try:
        waiter.result()
    except SupervisorError as exc:
        return str(exc)
    return None


async def _gateway_ready(settings: Settings, serving: asyncio.Task[None]) -> bool:
    """Poll our own /ready so 'ready' is only said once a request would succeed."""
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    url = f"http://{host}:{settings.port}/ready"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while not serving.done():
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return True
            await asyncio.sleep(0.25)
    return False


async def _startup_problem(
    settings: Settings, supervisor: Supervisor | None, serving: asyncio.Task[None]
) -> str | None:
    if supervisor is not None and (problem := await _await_servers(supervisor, serving)):
        return problem
    if serving.done() or not await _gateway_ready(settings, serving):
        return None  # the server stopped by itself (a signal, or a bind error it logged)
    problems = await check_replica_family(settings.tiers)
    if problems:
        return "refusing to serve: " + "; ".join(problems)
    log.info(
        "Gearshift ready: OpenAI API at http://%s:%d/v1 (models: auto, %s)",
        settings.host, settings.port, ", ".join(t.model for t in settings.tiers.values()),
    )  # fmt: skip
    return None


async def _store_problem(settings: Settings) -> str | None:
    """Migrate (or check) the trajectory store before anything starts, for a clear refusal."""
    if not settings.store.enabled:
        return None
    from gateway.store.database import StoreError, prepare_schema
    from gateway.store.rewards import load_hooks

    try:
        load_hooks(settings.rewards.hooks)
    except (ValueError, ImportError) as exc:
        return f"rewards.hooks: {exc}"

    try:
        await asyncio.to_thread(prepare_schema, settings.store.url, settings.store.migrate)
    except StoreError as exc:
        return f"{exc} (set store.url, or store.enabled: false to run without recording)"
    return None


async def run(settings: Settings) -> int:
    if problem := await _store_problem(settings):
        log.error("%s", problem)
        return 1
    from gateway.cli.sandbox_process import start_sandbox

    sandbox = await start_sandbox(settings)
    if sandbox is not None:  # the gateway reaches it with the same socket and token
        running = settings.sandbox.model_copy(
            update={"socket": sandbox.socket, "token": SecretStr(sandbox.token)}
        )
        settings = settings.model_copy(update={"sandbox": running})
    try:
        return await _run(settings)
    finally:
        if sandbox is not None:
            await sandbox.stop()


def uvicorn_config(settings: Settings, app: Any) -> uvicorn.Config:
    """Idle client connections stay open ``timeouts.client_idle_s`` (uvicorn's default is
    5 s): a client that reuses a pooled connection just as the server closes it gets a
    disconnect instead of an answer, so the server must be the one that waits longer."""
    return uvicorn.Config(
        app, host=settings.host, port=settings.port, log_level="warning", lifespan="on",
        timeout_graceful_shutdown=10, timeout_keep_alive=settings.timeouts.client_idle_s,
    )  # fmt: skip


async def _run(settings: Settings) -> int:
    supervisor = None
    if not settings.tiers:
        started = await _start_embedded(settings)
        if started is None:
            return 1
        settings, supervisor = started
    if settings.auth.mode == "none":
        log.warning(
            "API keys are OFF: any local client may call http://%s:%d (loopback only)",
            settings.host,
            settings.port,
        )
    server = _Server(uvicorn_config(settings, create_app(settings)))

    def on_signal() -> None:  # first signal: drain and stop; second: stop now
        server.force_exit = server.should_exit
        server.should_exit = True

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    serving = asyncio.create_task(server.serve())
    try:
        problem = await _startup_problem(settings, supervisor, serving)
        if problem:
            log.error("%s", problem)
            server.should_exit = True
        try:
            await serving
        except SystemExit:  # uvicorn's way of saying the app failed to start (it logged why)
            return 1
        return 1 if problem else 0
    finally:
        if supervisor is not None:
            await supervisor.stop()
        log.info("Gearshift stopped")
