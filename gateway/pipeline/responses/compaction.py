"""``POST /v1/responses/compact``: a conversation as its user messages and one summary.

    input    a stored chain (``previous_response_id``: the client sends nothing twice)
             and/or ``input`` items, earlier compaction items among them
    summary  the context stage's summarizer (``context.summarizer``: the fast tier by
             default, the extractive summary when it fails) over everything but the
             system messages, earlier compaction items folded in
    output   ``object: "response.compaction"``: every user message, as it was, then one
             ``compaction`` item whose ``encrypted_content`` is the summary (plain text:
             the gateway's own, not encrypted); a later request takes the output as its
             ``input`` and the model reads the summary as a user message

Nothing is stored as a response. The summary's model call is recorded as a step of the
chain's session with a ``context_events`` row (``api`` ``compact``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection

from gateway.errors import InvalidRequest, ModelNotFound
from gateway.pipeline.context.messages import HEAD_ROLES
from gateway.pipeline.context.summary import SummaryCall
from gateway.pipeline.request import RequestIdentity
from gateway.pipeline.responses import items
from gateway.pipeline.responses.output import usage
from gateway.pipeline.services import Services
from gateway.recording.context_event import call_record
from gateway.store import responses as stored
from router import Tier

StoreCall = Callable[[Callable[[Connection], Any], str | None], Awaitable[Any]]
NO_USAGE = {"prompt_tokens": 0, "completion_tokens": 0}


class CompactRequest(BaseModel):
    """The parameters of ``responses.compact``; the prompt-cache ones change nothing here."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: Annotated[str, Field(min_length=1)]
    input: str | list[Any] | None = None
    instructions: str | None = None
    previous_response_id: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    prompt_cache_retention: str | None = None
    service_tier: str | None = None
    image: Any = None  # refused when set


async def compact(
    services: Services, request: CompactRequest, who: RequestIdentity, call: StoreCall
) -> dict[str, Any]:
    """The compacted conversation; a 400 (404 for the chain) before any model call."""
    if request.image is not None:
        raise InvalidRequest("image is not supported by this gateway's compact", param="image")
    known = {pool.model for pool in services.pools.values()} | {"auto", "full", "fast"}
    if request.model not in known:
        raise ModelNotFound(
            f"model {request.model!r} does not exist; available: {', '.join(sorted(known))}",
            param="model",
        )
    chain = stored.Chain("", [])
    if request.previous_response_id is not None:
        prev = request.previous_response_id
        chain = await call(lambda c: stored.load_chain(c, who.tenant, prev), "previous_response_id")
    inputs = (
        items.normalize_input(request.input, (i["id"] for i in chain.items))
        if request.input is not None
        else []
    )
    every = [*chain.items, *inputs]
    if not any(i["type"] != "compaction" for i in every):
        raise InvalidRequest(
            "nothing to compact: give input items or a previous_response_id", param="input"
        )
    earlier = [i["encrypted_content"] for i in every if i["type"] == "compaction"]
    kept = [i for i in every if i["type"] != "compaction"]
    messages = items.to_messages(chain.items, inputs, request.instructions)
    span = [
        m for m in messages
        if m["role"] not in HEAD_ROLES and not str(m.get("content")).startswith(items.COMPACTED)
    ]  # fmt: skip
    tier = Tier.FULL if services.settings.context.summarizer == "full" else Tier.FAST
    summarizer = services.context.summarizer(await services.context.window(tier))
    text, by = await summarizer(span, "\n\n".join(earlier) or None)
    users = [i for i in kept if i["type"] == "message" and i["role"] == "user"]
    item = {"id": items.new_id("cmp"), "type": "compaction", "encrypted_content": text,
            "created_by": by}  # fmt: skip
    last = summarizer.calls[-1] if summarizer.calls else None
    session = who.session_id or chain.session or None
    if last is not None and services.recorder is not None:
        await services.recorder.record(_record(who, session, last, len(span), text))
    return {
        "id": items.new_id("cmpr"), "object": "response.compaction",
        "created_at": int(time.time()), "output": [*users, item],
        "usage": usage(last.answer.get("usage") if last is not None else NO_USAGE),
    }  # fmt: skip


def _record(
    who: RequestIdentity, session: str | None, last: SummaryCall, covered: int, text: str
) -> Any:
    """The summary's model call as a step, with its ``context_events`` row."""
    usage_of = last.answer.get("usage") or {}
    prompt = usage_of.get("prompt_tokens") if isinstance(usage_of, dict) else None
    completion = usage_of.get("completion_tokens") if isinstance(usage_of, dict) else None
    step = {"id": os.urandom(16).hex(), "request": last.request, "answer": last.answer,
            "tier": last.tier, "replica": last.replica, "duration_ms": last.duration_ms,
            "created_at": last.created_at}  # fmt: skip
    rec = call_record(step, who.tenant, who.api_key, who.request_id, session, "compaction")
    rec.context = {
        "api": "compact", "masked": 0, "clipped": 0, "summarized": covered, "dropped": 0,
        "tokens_before": prompt or 0, "tokens_after": completion or 0, "exact": prompt is not None,
        "summarizer": last.tier, "summary": text, "summary_steps": [],
    }  # fmt: skip
    return rec
