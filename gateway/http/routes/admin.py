"""The admin API: keys, limits and budgets in the store (admin keys only; docs/operations.md).

    GET    /admin/v1/keys                      live keys (?tenant=, ?all=true: revoked too)
    POST   /admin/v1/keys                      create; the answer holds the key, once
    GET    /admin/v1/keys/{id}                 one key
    DELETE /admin/v1/keys/{id}                 revoke
    POST   /admin/v1/keys/{id}/rotate          a new key for the same name; the old one
                                               works ``grace_s`` longer
    POST   /admin/v1/keys/{id}/expire          set or clear when the key stops working
    GET    /admin/v1/limits                    every limits row (?tenant=)
    PUT    /admin/v1/limits/{tenant}[/{key}]   set a tenant's or a key name's limits
    DELETE /admin/v1/limits/{tenant}[/{key}]   remove them
    GET    /admin/v1/usage/{tenant}            its counters in the current minute, day, month

Every write takes effect on this replica at once and on the others within
``auth.refresh_s`` (``gateway.access.sync``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field, model_validator
from sqlalchemy import Connection

from gateway.access import windows
from gateway.access.sync import AccessSync
from gateway.errors import Conflict, PermissionDenied, ResourceNotFound, StoreUnavailable
from gateway.http.body import read_model
from gateway.pipeline.services import Services
from gateway.store import keys
from gateway.store.queries import NotFound

T = TypeVar("T")
MAX_BODY = 64 << 10
NAME = keys.NAME
Name = Annotated[str, Path(pattern=NAME)]
KeyId = Annotated[str, Path(pattern=r"^key_[0-9a-f]{1,40}$")]
Item = Annotated[str, Field(min_length=1, max_length=256)]
LATEST = 2**37  # seconds since 1970: year 6325


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class When(Body):
    expires_at: int | None = Field(default=None, ge=0, le=LATEST, description="Unix seconds")
    expires_in_s: int | None = Field(default=None, gt=0, le=LATEST)

    @model_validator(mode="after")
    def _one(self) -> When:
        if self.expires_at is not None and self.expires_in_s is not None:
            raise ValueError("give expires_at or expires_in_s, not both")
        return self

    def moment(self) -> datetime | None:
        if self.expires_in_s is not None:
            return datetime.fromtimestamp(time.time() + self.expires_in_s, UTC)
        return datetime.fromtimestamp(self.expires_at, UTC) if self.expires_at is not None else None


class KeyCreate(When):
    tenant: str = Field(pattern=NAME)
    name: str = Field(pattern=NAME)
    admin: bool = False
    models: list[Item] | None = Field(default=None, max_length=256)
    tools: list[Item] | None = Field(default=None, max_length=256)


class Rotate(Body):
    grace_s: float = Field(default=0.0, ge=0, le=30 * 86400)


class LimitsBody(Body):
    requests_per_minute: int | None = Field(default=None, ge=0, le=2**31 - 1)
    tokens_per_minute: int | None = Field(default=None, ge=0, le=2**31 - 1)
    tokens_per_day: int | None = Field(default=None, ge=0, le=2**62)
    tokens_per_month: int | None = Field(default=None, ge=0, le=2**62)
    soft_percent: int = Field(default=80, ge=1, le=100)


class Admin:
    """An admin's request: the key check, then one store transaction."""

    def __init__(self, services: Services) -> None:
        self.services = services

    def __call__(self, request: Request) -> AccessSync:
        who = self.services.auth.authenticate(request.headers.get("authorization"))
        if not who.admin:
            raise PermissionDenied("the admin API needs an admin key")
        if self.services.access is None:
            raise StoreUnavailable("keys and limits live in the store, which is off")
        return self.services.access


async def run(access: AccessSync, fn: Callable[[Connection], T], write: bool = False) -> T:
    try:
        result = await access.call(fn)
    except NotFound as exc:
        raise ResourceNotFound(str(exc)) from None
    except keys.KeyExists as exc:
        raise Conflict(str(exc)) from None
    if write:
        await access.refresh()  # this replica at once; the others within refresh_s
    return result


def build_router(services: Services) -> APIRouter:
    router = APIRouter(prefix="/admin/v1")
    admin = Admin(services)
    _key_routes(router, admin)
    _limit_routes(router, admin)
    return router


def _key_routes(router: APIRouter, admin: Admin) -> None:
    services = admin.services

    @router.get("/keys")
    async def list_keys(
        request: Request,
        tenant: Annotated[str | None, Query(pattern=NAME)] = None,
        all: bool = False,  # the query parameter's name
    ) -> dict[str, Any]:
        access = admin(request)
        found = await run(access, lambda c: keys.list_keys(c, tenant, all_=all))
        configured = [
            {"id": None, "object": "api_key", "tenant": k.tenant, "name": k.name,
             "admin": k.admin, "models": k.models, "tools": k.tools, "source": "config"}
            for k in services.settings.auth.keys if tenant in (None, k.tenant)
        ]  # fmt: skip
        return {"object": "list", "data": configured + [k | {"source": "store"} for k in found]}

    @router.post("/keys", status_code=201)
    async def create(request: Request) -> dict[str, Any]:
        access = admin(request)
        b = await read_model(request, KeyCreate, MAX_BODY)
        view, key = await run(
            access,
            lambda c: keys.create(
                c, b.tenant, b.name, admin=b.admin, models=b.models, tools=b.tools,
                expires_at=b.moment(),
            ),
            write=True,
        )  # fmt: skip
        return view | {"key": key}

    @router.get("/keys/{key_id}")
    async def get_key(request: Request, key_id: KeyId) -> dict[str, Any]:
        return await run(admin(request), lambda c: keys.key_view(keys.get(c, key_id)))

    @router.delete("/keys/{key_id}")
    async def revoke(request: Request, key_id: KeyId) -> dict[str, Any]:
        return await run(admin(request), lambda c: keys.revoke(c, key_id), write=True)

    @router.post("/keys/{key_id}/rotate")
    async def rotate(request: Request, key_id: KeyId) -> dict[str, Any]:
        access = admin(request)
        b = await read_model(request, Rotate, MAX_BODY)
        view, key = await run(access, lambda c: keys.rotate(c, key_id, b.grace_s), write=True)
        return view | {"key": key}

    @router.post("/keys/{key_id}/expire")
    async def expire(request: Request, key_id: KeyId) -> dict[str, Any]:
        access = admin(request)
        b = await read_model(request, When, MAX_BODY)
        return await run(access, lambda c: keys.expire(c, key_id, b.moment()), write=True)


def _limit_routes(router: APIRouter, admin: Admin) -> None:
    @router.get("/limits")
    async def list_limits(
        request: Request, tenant: Annotated[str | None, Query(pattern=NAME)] = None
    ) -> dict[str, Any]:
        rows = await run(admin(request), lambda c: keys.list_limits(c, tenant))
        return {"object": "list", "data": [keys.limit_view(r) for r in rows]}

    async def put_limits(request: Request, tenant: str, key_name: str) -> dict[str, Any]:
        access = admin(request)
        b = await read_model(request, LimitsBody, MAX_BODY)
        values = b.model_dump(exclude={"soft_percent"})
        return await run(
            access, lambda c: keys.set_limits(c, tenant, key_name, values, b.soft_percent), True
        )

    @router.put("/limits/{tenant}")
    async def tenant_limits(request: Request, tenant: Name) -> dict[str, Any]:
        return await put_limits(request, tenant, "")

    @router.put("/limits/{tenant}/{key_name}")
    async def key_limits(request: Request, tenant: Name, key_name: Name) -> dict[str, Any]:
        return await put_limits(request, tenant, key_name)

    @router.delete("/limits/{tenant}")
    async def drop_tenant_limits(request: Request, tenant: Name) -> dict[str, Any]:
        return await run(admin(request), lambda c: keys.delete_limits(c, tenant, ""), True)

    @router.delete("/limits/{tenant}/{key_name}")
    async def drop_key_limits(request: Request, tenant: Name, key_name: Name) -> dict[str, Any]:
        return await run(admin(request), lambda c: keys.delete_limits(c, tenant, key_name), True)

    @router.get("/usage/{tenant}")
    async def usage(request: Request, tenant: Name) -> dict[str, Any]:
        now = time.time()
        rows = await run(admin(request), lambda c: keys.usage(c, tenant, windows.current(now)))
        return {"object": "list", "tenant": tenant, "data": rows}
