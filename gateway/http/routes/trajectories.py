"""Trajectory endpoints: sessions with a task, their end and outcome, feedback, reads.

    POST /v1/sessions                  start a session (task id, GRPO group, expected actions)
    POST /v1/sessions/{id}/end         end it: outcome, reward; computes session rewards
    GET  /v1/sessions/{id}             its steps (token ids, logprobs) and rewards
    GET  /v1/steps/{id}                one step; 200 means it is committed to the store
    POST /v1/feedback                  a user's score for a session or a step

Everything is scoped to the caller's tenant (from its API key); another
tenant's session answers 404 exactly like a missing one.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Path, Request
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from sqlalchemy import Connection

from gateway.auth import Principal
from gateway.errors import (
    Conflict,
    InvalidRequest,
    ResourceNotFound,
    StoreUnavailable,
)
from gateway.http.body import read_model
from gateway.pipeline.services import Services
from gateway.recording.recorder import RecorderClosed
from gateway.store import queries

T = TypeVar("T")
MAX_BODY = 1 << 20
Ident = Annotated[str, Path(min_length=1, max_length=256)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Action(Body):
    name: str = Field(min_length=1, max_length=256)
    arguments: dict[str, Any] = Field(default_factory=dict)


class SessionStart(Body):
    id: str | None = Field(
        default=None, min_length=1, max_length=256, description="X-Session-Id to use"
    )
    task_id: str | None = Field(default=None, max_length=256)
    group_id: str | None = Field(default=None, max_length=256)
    expected_actions: list[Action] | None = Field(default=None, max_length=1000)


class SessionEnd(Body):
    outcome: str | None = Field(default=None, max_length=64)
    reward: float | None = None

    @field_validator("reward")
    @classmethod
    def _finite(cls, v: float | None) -> float | None:
        if v is not None and not math.isfinite(v):
            raise ValueError("reward must be a finite number")
        return v


class Feedback(Body):
    session_id: str | None = Field(default=None, min_length=1, max_length=256)
    step_id: str | None = Field(default=None, min_length=1, max_length=64)
    score: float
    label: str | None = Field(default=None, max_length=64)
    comment: str | None = Field(default=None, max_length=10_000)

    @model_validator(mode="after")
    def _target(self) -> Feedback:
        if (self.session_id is None) == (self.step_id is None):
            raise ValueError("give exactly one of session_id or step_id")
        if not math.isfinite(self.score):
            raise ValueError("score must be a finite number")
        return self


def build_router(services: Services) -> APIRouter:
    router = APIRouter(prefix="/v1")

    def principal(request: Request) -> Principal:
        return services.auth.authenticate(request.headers.get("authorization"))

    async def store(fn: Callable[[Connection], T]) -> T:
        if services.recorder is None:
            raise StoreUnavailable("recording is off (store.enabled: false)")
        try:
            return await services.recorder.call(fn)
        except queries.NotFound as exc:
            raise ResourceNotFound(str(exc)) from None
        except FileExistsError as exc:
            raise Conflict(str(exc)) from None
        except RecorderClosed as exc:
            raise StoreUnavailable(str(exc)) from None

    @router.post("/sessions", status_code=201)
    async def start(request: Request) -> dict[str, Any]:
        who = principal(request)
        body = await read_model(request, SessionStart, MAX_BODY)
        actions = (
            [a.model_dump() for a in body.expected_actions]
            if body.expected_actions is not None
            else None
        )
        return await store(
            lambda c: queries.start_session(
                c, who.tenant, who.key_name, body.id, body.task_id, body.group_id, actions
            )
        )

    @router.post("/sessions/{ident}/end")
    async def end(request: Request, ident: Ident) -> dict[str, Any]:
        who = principal(request)
        body = await read_model(request, SessionEnd, MAX_BODY)
        return await store(
            lambda c: queries.end_session(c, who.tenant, ident, body.outcome, body.reward)
        )

    @router.get("/sessions/{ident}")
    async def session(request: Request, ident: Ident) -> dict[str, Any]:
        who = principal(request)
        return await store(lambda c: queries.get_session(c, who.tenant, ident))

    @router.get("/steps/{ident}")
    async def step(request: Request, ident: Ident) -> dict[str, Any]:
        who = principal(request)
        return await store(lambda c: queries.get_step(c, who.tenant, ident))

    @router.post("/feedback", status_code=201)
    async def feedback(request: Request) -> dict[str, Any]:
        who = principal(request)
        body = await read_model(request, Feedback, MAX_BODY)
        if body.step_id is not None and not body.step_id.isalnum():
            raise InvalidRequest("step_id must be the id from x-gearshift-step-id", param="step_id")
        return await store(
            lambda c: queries.add_feedback(
                c, who.tenant, session=body.session_id, step=body.step_id,
                score=body.score, label=body.label, comment=body.comment,
            )
        )  # fmt: skip

    return router
