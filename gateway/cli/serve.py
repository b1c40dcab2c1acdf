"""``gearshift serve``: the gateway, and with no tiers configured the embedded stack under it.

Order of start-up: provision and start the vLLM servers (embedded only), start the gateway
at once (``/health`` answers, ``/ready`` says 503 until the checks pass), wait for the servers
and for a healthy replica in every tier, check that the tiers are one model family, then open
``/ready`` and say ``Gearshift ready``. A check that fails stops the process with exit code 1
(or, for a tier with ``family_check: warn``, is logged and skipped); so does a start-up step
that raises. On SIGINT/SIGTERM, in any phase, the gateway drains (at most 10 s) and stops,
then the vLLM servers are stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Iterator, Mapping
from typing import Any

import orjson
import uvicorn
from pydantic import SecretStr
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from backends.supervisor import Supervisor, SupervisorError
from gateway.cli import heap
from gateway.config import Settings, TierSettings
from gateway.http.app import create_app
from gateway.upstream.family_probe import family_problems
from router import Tier

log = logging.getLogger("gearshift")


class _Server(uvicorn.Server):
    """uvicorn's server, minus its signal capture: `serve` must stop the vLLM
    servers after the gateway, and uvicorn would re-raise the signal first."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    async def serve_until_stopped(self) -> bool:
        """`serve`; False when uvicorn could not start (it logged why, then ``sys.exit``: a
        SystemExit out of a task would stop the event loop under the rest of the shutdown)."""
        try:
            await self.serve()
        except SystemExit:
            return False
        return True


class _GranianServer:
    """Experimental, off by default (``GEARSHIFT_HTTP_SERVER=granian``, granian from the
    ``bench`` extra): the same app under granian's embedded server (``granian.server.embed``,
    one ASGI worker on this event loop), behind `_Server`'s interface for `_run`. Measured
    against uvicorn by bench.http_servers (docs/decisions/http-server.md): about the same
    CPU a request (0.9-1.1x), so uvicorn stays. Granian's embedded mode calls itself experimental. Its HTTP/1 header-read
    timeout is what closes an idle keep-alive connection, so it is ``client_idle_s`` too."""

    def __init__(self, settings: Settings, app: ASGIApp) -> None:
        from granian.constants import Interfaces
        from granian.http import HTTP1Settings
        from granian.log import LogLevels
        from granian.server.embed import Server

        self.app = app
        self.started = False  # the app's lifespan started (granian listens from before it)
        self._should_exit = self._force_exit = False
        idle_ms = settings.timeouts.client_idle_s * 1000
        self._server: Any = Server(  # granian's embed module is untyped
            self._watch_lifespan, address=settings.host, port=settings.port,
            interface=Interfaces.ASGI, log_level=LogLevels.warning, websockets=False,
            http1_settings=HTTP1Settings(header_read_timeout=idle_ms),
        )  # fmt: skip
        self._server.workers_kill_timeout = 10  # the drain; not a parameter of embed.Server

    async def _watch_lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def watched(message: Message) -> None:
            if message["type"] == "lifespan.startup.complete":
                self.started = True
            await send(message)

        await self.app(scope, receive, watched)

    @property
    def should_exit(self) -> bool:
        return self._should_exit

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        if value and not self._should_exit:
            self._server.stop()
        self._should_exit = value

    @property
    def force_exit(self) -> bool:
        return self._force_exit

    @force_exit.setter
    def force_exit(self, value: bool) -> None:
        if value:
            for worker in self._server.wrks:
                worker.kill()
        self._force_exit = value

    async def serve_until_stopped(self) -> bool:
        """Granian's `serve`; False when it could not start (bind error, lifespan failure:
        granian then returns as if stopped, so `started` tells)."""
        try:
            await self._server.serve()
        except TimeoutError:  # the drain ran out: embed's join does not kill on its own
            for worker in self._server.wrks:
                worker.kill()
        except Exception as exc:  # granian raises OSError, FatalError, ...
            log.error("granian could not serve: %s: %s", type(exc).__name__, exc)
            return False
        return self.started


class _StartupGate:
    """The app, with ``/ready`` held at 503 until `serve`'s start-up checks have passed.

    The app alone answers ``/ready`` from its replicas' health (tests that build it with
    `create_app` see just that); `serve` owes clients its checks too, so until `open` the
    answer is 503 with a ``reason``, whatever the replicas say."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.reason: str | None = "the start-up checks have not finished"

    def open(self) -> None:
        self.reason = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.reason is None or scope["type"] != "http" or scope["path"] != "/ready":
            await self.app(scope, receive, send)
            return
        _, body = await self._answer(scope, receive)  # the replicas' status, for the operator
        data = orjson.loads(body) if body.startswith(b"{") else {}
        data.update(ready=False, reason=self.reason)
        response = Response(orjson.dumps(data), 503, media_type="application/json")
        await response(scope, receive, send)

    async def app_ready(self) -> bool:
        """Whether the app alone says ready: every tier has a replica that passed its check."""
        scope: Scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
            "scheme": "http", "path": "/ready", "raw_path": b"/ready", "root_path": "",
            "query_string": b"", "headers": [], "client": None, "server": None,
        }  # fmt: skip

        async def receive() -> Message:
            return {"type": "http.request", "body": b"", "more_body": False}

        status, _ = await self._answer(scope, receive)
        return status == 200

    async def _answer(self, scope: Scope, receive: Receive) -> tuple[int, bytes]:
        """The app's answer to the request, kept instead of sent."""
        status, chunks = 500, []

        async def keep(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, keep)
        return status, b"".join(chunks)


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


async def _await_servers(supervisor: Supervisor) -> str | None:
    """Wait for every vLLM server; an error message if one failed."""
    last_note: dict[str, int] = {}

    def note(name: str, waited: float) -> None:
        if int(waited) // 15 != last_note.get(name, -1):
            last_note[name] = int(waited) // 15
            log.info("waiting for vLLM %s to load the model (%.0fs)", name, waited)

    try:
        await supervisor.wait_ready(note)
    except SupervisorError as exc:
        return str(exc)
    return None


async def _family_problem(tiers: Mapping[Tier, TierSettings]) -> str | None:
    """The same-family check: problems a tier may skip are warnings, the others a refusal."""
    problems = await family_problems(tiers)
    for p in problems:
        if not p.required(tiers):
            log.warning(
                "same-family check failed, serving anyway (family_check: warn): %s", p.message
            )
    required = [p.message for p in problems if p.required(tiers)]
    if not required:
        return None
    return (
        "refusing to serve: the tiers are not shown to be one model family: "
        + "; ".join(required)
        + " (to serve anyway, set tiers.<tier>.family_check: warn)"
    )


async def _startup_problem(
    settings: Settings,
    supervisor: Supervisor | None,
    server: _Server | _GranianServer,
    gate: _StartupGate,
) -> str | None:
    if supervisor is not None and (problem := await _await_servers(supervisor)):
        return problem
    while not server.started:  # listening, the app's lifespan started
        await asyncio.sleep(0.05)
    while not await gate.app_ready():  # so 'ready' is only said once a request would succeed
        await asyncio.sleep(0.25)
    if problem := await _family_problem(settings.tiers):
        return problem
    frozen = heap.settle()  # before the first request: what start-up built lives on
    log.debug("start-up heap frozen: %d objects", frozen)
    gate.open()
    log.info(
        "Gearshift ready: OpenAI API at http://%s:%d/v1 (models: auto, %s)",
        settings.host, settings.port, ", ".join(t.model for t in settings.tiers.values()),
    )  # fmt: skip
    return None


async def _start_up(
    settings: Settings,
    supervisor: Supervisor | None,
    server: _Server | _GranianServer,
    gate: _StartupGate,
    serving: asyncio.Task[bool],
) -> str | None:
    """The start-up steps, raced against the server: when it stops by itself (a signal, or a
    bind error it logged) they are cancelled wherever they are; a step that raises is a
    problem like a failed check, so the server never keeps running after it."""
    steps = asyncio.create_task(_startup_problem(settings, supervisor, server, gate))
    try:
        await asyncio.wait({serving, steps}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not steps.done():
            steps.cancel()
            await asyncio.wait({steps})
    if steps.cancelled():  # by us, the server having stopped; or by something unforeseen
        return None if serving.done() else "refusing to serve: the start-up steps were cancelled"
    if (exc := steps.exception()) is not None:
        log.error("a start-up step failed", exc_info=exc)
        return f"refusing to serve: a start-up step failed: {type(exc).__name__}: {exc}"
    return steps.result()


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
    from gateway.cli.sandbox_process import check_external, start_sandbox

    if settings.sandbox.enabled and settings.sandbox.external:  # run apart: check, start none
        if problem := await check_external(settings.sandbox):
            log.error("%s", problem)
            return 1
        return await _run(settings)
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
    gate = _StartupGate(create_app(settings))
    server: _Server | _GranianServer
    if os.environ.get("GEARSHIFT_HTTP_SERVER", "uvicorn") == "granian":  # experimental
        server = _GranianServer(settings, gate)
    else:
        server = _Server(uvicorn_config(settings, gate))

    def on_signal() -> None:  # first signal: drain and stop; second: stop now
        server.force_exit = server.should_exit
        server.should_exit = True

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    serving = asyncio.create_task(server.serve_until_stopped())
    try:
        problem = await _start_up(settings, supervisor, server, gate, serving)
        if problem:
            log.error("%s", problem)
            gate.reason = f"stopping: {problem}"  # while the server drains
            server.should_exit = True
        return 0 if await serving and not problem else 1
    finally:
        if not serving.done():  # something above raised: never leave the port open
            server.should_exit = True
            await asyncio.wait({serving})
        if supervisor is not None:
            await supervisor.stop()
        log.info("Gearshift stopped")
