"""The ``gearshift`` command line."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import uvicorn
from pydantic import ValidationError

from gateway.config import ConfigError, Settings, load_settings

log = logging.getLogger("gearshift")


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _load(path: Path | None) -> Settings:
    try:
        return load_settings(path)
    except ConfigError as exc:
        raise SystemExit(f"gearshift: {exc}") from None
    except ValidationError as exc:
        lines = [
            f"  {'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
            for e in exc.errors()
        ]
        raise SystemExit("gearshift: invalid configuration\n" + "\n".join(lines)) from None


class _Server(uvicorn.Server):
    """uvicorn's server, minus its signal capture: `serve` must stop the vLLM
    servers after the gateway, and uvicorn would re-raise the signal first."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def _serve(settings: Settings) -> int:

    from gateway.app import create_app

    supervisor = None
    if not settings.tiers:
        from backends.supervisor import SupervisorError
        from gateway.embedded import build_stack

        log.info(
            "no tiers configured: starting the embedded default stack under %s",
            settings.embedded.home,
        )
        stack = await asyncio.to_thread(build_stack, settings.embedded)
        settings = settings.model_copy(update={"tiers": stack.tiers})
        supervisor = stack.supervisor
        await supervisor.start()
    if settings.auth.mode == "none":
        log.warning(
            "API keys are OFF: any local client may call http://%s:%d (loopback only)",
            settings.host,
            settings.port,
        )
    server = _Server(
        uvicorn.Config(
            create_app(settings),
            host=settings.host,
            port=settings.port,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=10,
        )
    )

    def on_signal() -> None:  # first signal: drain and stop; second: stop now
        server.force_exit = server.should_exit
        server.should_exit = True

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    serving = asyncio.create_task(server.serve())
    try:
        if supervisor is not None:
            last_note: dict[str, int] = {}

            def note(name: str, waited: float) -> None:
                if int(waited) // 15 != last_note.get(name, -1):
                    last_note[name] = int(waited) // 15
                    log.info("waiting for vLLM %s to load the model (%.0fs)", name, waited)

            waiter = asyncio.create_task(supervisor.wait_ready(note))
            await asyncio.wait({serving, waiter}, return_when=asyncio.FIRST_COMPLETED)
            if waiter.done():
                try:
                    waiter.result()
                except SupervisorError as exc:
                    log.error("%s", exc)
                    server.should_exit = True
                    await serving
                    return 1
            else:
                waiter.cancel()
        if not serving.done() and await _gateway_ready(settings, serving):
            log.info(
                "Gearshift ready: OpenAI API at http://%s:%d/v1 (models: auto, %s)",
                settings.host,
                settings.port,
                ", ".join(t.model for t in settings.tiers.values()),
            )
        await serving
    finally:
        if supervisor is not None:
            await supervisor.stop()
    return 0


async def _gateway_ready(settings: Settings, serving: asyncio.Task[None]) -> bool:
    """Poll our own /ready so 'ready' is only said once a request would succeed."""
    import aiohttp

    url = f"http://{settings.host if settings.host not in ('0.0.0.0', '::') else '127.0.0.1'}:{settings.port}/ready"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        while not serving.done():
            try:
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return True
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.25)
    return False


def cmd_serve(args: argparse.Namespace) -> int:
    settings = _load(args.config)
    if args.port is not None:
        settings = settings.model_copy(update={"port": args.port})
    try:
        import uvloop

        return uvloop.run(_serve(settings))
    except ImportError:
        return asyncio.run(_serve(settings))


def cmd_provision(args: argparse.Namespace) -> int:
    from backends.provision import ProvisionError, provision

    settings = _load(args.config)
    try:
        path = provision(settings.embedded.home, settings.embedded.python)
    except ProvisionError as exc:
        raise SystemExit(f"gearshift: {exc}") from None
    print(path)
    return 0


def cmd_keys_new(args: argparse.Namespace) -> int:
    from gateway.auth import new_key

    key, digest = new_key()
    print(f"key (give it to the client, it is not stored): {key}")
    print("config entry:")
    print(f"  - {{name: {args.name}, tenant: {args.tenant}, sha256: '{digest}'}}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gearshift", description=__doc__)
    parser.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error"]
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve", help="run the gateway (and the embedded default stack without tiers)"
    )
    serve.add_argument("--config", type=Path, help="YAML configuration file")
    serve.add_argument("--port", type=int, help="override the listening port")
    serve.set_defaults(func=cmd_serve)

    prov = sub.add_parser("provision", help="convert the default model into its safetensors cache")
    prov.add_argument("--config", type=Path)
    prov.set_defaults(func=cmd_provision)

    keys = sub.add_parser("keys", help="API key helpers")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    new = keys_sub.add_parser("new", help="print a new key and its config entry")
    new.add_argument("--tenant", default="default")
    new.add_argument("--name", default="key-1")
    new.set_defaults(func=cmd_keys_new)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging(args.log_level)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
