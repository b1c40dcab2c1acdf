"""The admin API of the control plane: routing versions and kill switches (admin keys only;
docs/operations.md).

    GET    /admin/v1/routing                   what serves now, the versions, the history
    POST   /admin/v1/routing/versions          store a version {policy, params, note}
    GET    /admin/v1/routing/diff?from=&to=    what differs between two versions
    POST   /admin/v1/routing/publish           {version, note}: serve it to everyone
    POST   /admin/v1/routing/rollback          {note}: back to the version before
    POST   /admin/v1/routing/canary            {version, weight, note}: a share of sessions
    DELETE /admin/v1/routing/canary            end the canary
    GET    /admin/v1/kill-switches             every switch and the history
    POST   /admin/v1/kill-switches             {kind, target, active, reason}

Every change is an event in the store naming the admin key that made it, applied on this
replica at once and on every other within ``auth.refresh_s`` (``gateway.routing.control``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Connection

from gateway.auth import Principal
from gateway.errors import (
    Conflict,
    InvalidRequest,
    PermissionDenied,
    ResourceNotFound,
    StoreUnavailable,
)
from gateway.http.body import read_model
from gateway.pipeline.services import Services
from gateway.store import control
from router import PolicyError, build_policy

MAX_BODY = 64 << 10
Note = Field(default=None, max_length=2000)
VersionId = Field(pattern=r"^[0-9a-f]{16}$")


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class VersionCreate(Body):
    policy: str = Field(min_length=1, max_length=64)
    params: dict[str, Any] = Field(default_factory=dict)
    note: str | None = Note


class Publish(Body):
    version: str = VersionId
    note: str | None = Note


class Rollback(Body):
    note: str | None = Note


class Canary(Body):
    version: str = VersionId
    weight: float = Field(gt=0, lt=1)
    note: str | None = Note


class Switch(Body):
    kind: Literal["all_to_full", "tier_off", "tool_off", "sandbox_off", "tenant_off"]
    target: str = Field(default="", max_length=256)
    active: bool
    reason: str | None = Note


def overview(conn: Connection, services: Services) -> dict[str, Any]:
    state = control.state(conn)
    plane = services.control
    return {
        "serving": {
            "published": state.published or plane.base.id,
            "source": "store" if state.published else "config",
            "canary": state.canary,
            "canary_weight": state.canary_weight,
        },
        "config_file_version": {"id": plane.base.id, "config": plane.base.config},
        "versions": control.versions(conn),
        "events": control.events(conn, 50),
    }


class _Admin:
    def __init__(self, services: Services) -> None:
        self.services = services

    def who(self, request: Request) -> Principal:
        who = self.services.auth.authenticate(request.headers.get("authorization"))
        if not who.admin:
            raise PermissionDenied("the admin API is for admin keys")
        return who

    async def store(self, fn: Callable[[Connection], Any]) -> Any:
        sync = self.services.control_sync
        if sync is None:
            raise StoreUnavailable("routing versions and kill switches live in the store")
        try:
            return await sync.call(fn)
        except control.UnknownVersion as exc:
            raise ResourceNotFound(str(exc), param="version") from None
        except control.ControlError as exc:
            raise Conflict(str(exc)) from None


def _state(s: control.RoutingState) -> dict[str, Any]:
    return {"published": s.published, "canary": s.canary, "canary_weight": s.canary_weight}


def build_router(services: Services) -> APIRouter:
    router = APIRouter(prefix="/admin/v1")
    adm = _Admin(services)
    _versions(router, services, adm)
    _serving(router, adm)
    _switches(router, services, adm)
    return router


def _versions(router: APIRouter, services: Services, adm: _Admin) -> None:
    @router.get("/routing")
    async def routing(request: Request) -> dict[str, Any]:
        adm.who(request)
        return await adm.store(lambda c: overview(c, services))  # type: ignore[no-any-return]

    @router.post("/routing/versions", status_code=201)
    async def create(request: Request) -> dict[str, Any]:
        who = adm.who(request)
        body = await read_model(request, VersionCreate, MAX_BODY)
        try:
            build_policy(body.policy, body.params)  # never store what cannot route
        except PolicyError as exc:
            raise InvalidRequest(str(exc), param="params") from None
        config = {"policy": body.policy, "params": body.params}
        vid, created = await adm.store(
            lambda c: control.create_version(c, config, who.key_name, body.note)
        )
        return {"id": vid, "created": created, "config": config}

    @router.get("/routing/diff")
    async def version_diff(request: Request) -> dict[str, Any]:
        adm.who(request)
        a, b = request.query_params.get("from"), request.query_params.get("to")
        if not a or not b:
            raise InvalidRequest("give the two versions as from= and to=", param="from")
        configs = await adm.store(lambda c: control.version_configs(c, [a, b]))
        configs.setdefault(services.control.base.id, services.control.base.config)
        for name, vid in (("from", a), ("to", b)):
            if vid not in configs:
                raise InvalidRequest(f"no routing version {vid!r}", param=name)
        return {"from": a, "to": b, "changes": control.config_diff(configs[a], configs[b])}


def _serving(router: APIRouter, adm: _Admin) -> None:
    @router.post("/routing/publish")
    async def publish(request: Request) -> dict[str, Any]:
        who = adm.who(request)
        body = await read_model(request, Publish, MAX_BODY)
        return _state(
            await adm.store(lambda c: control.publish(c, body.version, who.key_name, body.note))
        )

    @router.post("/routing/rollback")
    async def rollback(request: Request) -> dict[str, Any]:
        who = adm.who(request)
        body = await read_model(request, Rollback, MAX_BODY)
        return _state(await adm.store(lambda c: control.rollback(c, who.key_name, body.note)))

    @router.post("/routing/canary")
    async def canary(request: Request) -> dict[str, Any]:
        who = adm.who(request)
        body = await read_model(request, Canary, MAX_BODY)
        return _state(
            await adm.store(
                lambda c: control.set_canary(c, body.version, body.weight, who.key_name, body.note)
            )
        )

    @router.delete("/routing/canary")
    async def end_canary(request: Request) -> dict[str, Any]:
        who = adm.who(request)
        return _state(await adm.store(lambda c: control.end_canary(c, who.key_name)))


def _switches(router: APIRouter, services: Services, adm: _Admin) -> None:
    @router.get("/kill-switches")
    async def kill_switches(request: Request) -> dict[str, Any]:
        adm.who(request)
        return await adm.store(  # type: ignore[no-any-return]
            lambda c: {"data": control.switches(c), "events": control.switch_events(c, 50)}
        )

    @router.post("/kill-switches")
    async def set_switch(request: Request) -> dict[str, Any]:
        who = adm.who(request)
        body = await read_model(request, Switch, MAX_BODY)
        if (body.kind in control.TARGETED) != bool(body.target):
            why = "needs a target" if body.kind in control.TARGETED else "takes no target"
            raise InvalidRequest(f"{body.kind} {why}", param="target")
        if body.kind == "tier_off" and body.target not in {str(t) for t in services.pools}:
            known = ", ".join(sorted(str(t) for t in services.pools))
            raise InvalidRequest(f"tier_off: target must be a tier ({known})", param="target")
        return await adm.store(  # type: ignore[no-any-return]
            lambda c: control.set_switch(
                c, body.kind, body.target, body.active, who.key_name, body.reason
            )
        )
