"""The tier's context window: configured, else what its replica says, else the default."""

from __future__ import annotations

import asyncio

import aiohttp
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from gateway.config import Settings
from gateway.pipeline.context.stage import ContextStage
from gateway.routing.calibration import TokenCalibrator
from gateway.upstream.pool import TierPool
from router import Tier
from tests.support.servers import serve_in_thread


def replica(answers: list[int | None]) -> tuple[Starlette, list[int]]:
    """A replica whose /v1/models says each of ``answers`` in turn (None: a 404)."""
    asked: list[int] = []

    async def models(request: Request) -> JSONResponse:
        asked.append(1)
        length = answers[min(len(asked), len(answers)) - 1]
        if length is None:
            return JSONResponse({"error": "no"}, status_code=404)
        return JSONResponse({"data": [{"id": "m", "max_model_len": length}]})

    return Starlette(routes=[Route("/v1/models", models)]), asked


def windows(answers: list[int | None], calls: int, **context: object) -> tuple[list[int], int]:
    app, asked = replica(answers)

    async def go() -> list[int]:
        with serve_in_thread(app) as url:
            settings = Settings(tiers={"full": {"model": "m", "replicas": [url]}}, context=context)
            pool = TierPool(Tier.FULL, "m", [url], settings.breaker, settings.health)
            async with aiohttp.ClientSession() as http:
                stage = ContextStage(
                    settings, {Tier.FULL: pool}, TokenCalibrator(None), lambda: None, lambda: http
                )
                return [await stage.window(Tier.FULL) for _ in range(calls)]

    return asyncio.run(go()), len(asked)


def test_the_replicas_max_model_len_is_asked_once():
    assert windows([32768], 3) == ([32768] * 3, 1)


def test_the_configured_window_needs_no_question():
    assert windows([32768], 2, window_tokens={"full": 8192}) == ([8192, 8192], 0)


def test_a_replica_that_cannot_say_gives_the_default_and_is_not_asked_on_every_request():
    found, asked = windows([None, 32768], 3)
    assert found == [4096] * 3 and asked == 1  # embedded.max_model_len; asked again later
