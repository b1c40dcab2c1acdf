"""Values the pipeline's stages take, made by hand."""

from __future__ import annotations

import time
from typing import Any

from gateway.pipeline.request import ParsedRequest, RequestIdentity
from router import Endpoint

MESSAGES = [{"role": "user", "content": "hi"}]


def parsed(
    body: dict[str, Any] | None = None,
    *,
    endpoint: Endpoint = "chat",
    model: str | None = None,
    session_id: str | None = None,
    tenant: str = "default",
    t0: float | None = None,
) -> ParsedRequest:
    body = {"model": "auto", "messages": MESSAGES} if body is None else body
    who = RequestIdentity(
        "req-1",
        time.perf_counter() if t0 is None else t0,
        endpoint,
        model or str(body.get("model", "auto")),
        tenant,
        "key-1",
        session_id,
        "task-1",
        "group-1",
    )
    return ParsedRequest(who, body)
