"""What enters the pipeline: a request's identity and its validated body, fixed once parsed.

Nothing here changes after ``gateway.http.completions`` builds it; each stage returns a
new value of its own (``Routing``, ``UpstreamRequest``, ``Outcome``), so every field has
exactly one writer.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from router import Endpoint

PATHS: dict[Endpoint, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True, slots=True)
class RequestIdentity:
    """Who asked, for what, and when the request entered the process."""

    request_id: str
    t0: float  # perf_counter() when the request entered the process
    endpoint: Endpoint
    requested_model: str
    tenant: str = "default"
    api_key: str = "anonymous"
    session_id: str | None = None  # X-Session-Id, or the body's ``user``
    task_id: str | None = None
    group_id: str | None = None
    # "auto": the context stage applies whatever the config says (a Responses request's
    # ``truncation: "auto"``); "disabled": never; None: as configured (chat completions)
    context: str | None = None

    def elapsed_ms(self, now: float | None = None) -> float:
        return ((time.perf_counter() if now is None else now) - self.t0) * 1000.0


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """A validated completion request. ``body`` is the client's JSON object exactly as sent:
    no stage mutates it (the upstream body is a copy built once, ``upstream_body``);
    ``raw`` is the text it was parsed from (empty when built in code), which the recorder
    stores without serializing the object again; ``encoded``: some of ``body``'s fields
    as ``orjson.dumps`` writes them (a named session's ``messages`` and ``tools``, written
    for its validation), which the upstream payload embeds instead of writing them again."""

    identity: RequestIdentity
    body: dict[str, Any]
    raw: bytes = b""
    encoded: Mapping[str, bytes] = field(default_factory=dict)

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))
