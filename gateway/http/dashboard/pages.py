"""The operators' dashboard: server-rendered HTML at ``/dashboard``, admin keys only.

    GET  /dashboard                    agent metrics, routing mix, latency, escalations
    GET  /dashboard/sessions           recent sessions
    GET  /dashboard/sessions/{id}      one session's episode timeline
    GET  /dashboard/routing            routing versions: diff, publish, canary, rollback
    GET  /dashboard/switches           kill switches: set, clear, history
    GET  /dashboard/approvals          tool calls waiting for a human: approve, deny
    GET  /dashboard/login, POST …      log in with an admin key; POST /dashboard/logout

A browser logs in once: the key goes into a cookie scoped to ``/dashboard`` (HttpOnly,
SameSite=Strict, Secure over HTTPS), checked like a bearer key on every page, so a
revoked or expired key stops working there as everywhere. An ``Authorization`` header
works too (curl, tests). Without keys (``auth.mode: none``, loopback only) the dashboard
is open, like the rest of the gateway. Every form posts to the same origin: a POST whose
``Origin`` is another site is refused (with SameSite=Strict, a second line of defence).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from sqlalchemy import Connection, select
from starlette.responses import RedirectResponse, Response

from gateway.errors import AuthenticationFailed
from gateway.http.dashboard import approvals as approval_pages
from gateway.http.dashboard import base, svg
from gateway.http.dashboard import control as control_pages
from gateway.pipeline.services import Services
from gateway.store import agent_metrics, dashboard
from gateway.store.schema import sessions

WINDOWS = {"1h": (timedelta(hours=1), 60), "24h": (timedelta(days=1), 900),
           "7d": (timedelta(days=7), 7200)}  # fmt: skip
SESSIONS_PAGE = 50


def _tenants(conn: Connection) -> list[str]:
    return [
        r[0]
        for r in conn.execute(
            select(sessions.c.tenant_id).distinct().order_by(sessions.c.tenant_id)
        )
    ]


def _overview(conn: Connection, window: str, tenant: str | None) -> dict[str, Any]:
    span, bucket_s = WINDOWS[window]
    now = datetime.now(UTC)
    since = now - span
    buckets = dashboard.traffic(conn, since=since, bucket_s=bucket_s, tenant=tenant)
    times = [b.start for b in buckets]
    charts = {}
    if buckets:
        tiers = [t for t in ("full", "fast", "none") if any(t in b.calls for b in buckets)]
        charts = {
            "mix": svg.stacked_bars(
                "Model calls per tier", times,
                {t: [b.calls.get(t, 0) for b in buckets] for t in tiers}, "calls",
            ),
            "latency": svg.lines(
                "Mean time to the last byte per tier", times,
                {t: [b.mean_ms.get(t) for b in buckets] for t in tiers if t != "none"}, "ms",
            ),
            "ttft": svg.lines(
                "Mean time to the first byte per tier", times,
                {t: [b.mean_ttft_ms.get(t) for b in buckets] for t in tiers if t != "none"}, "ms",
            ),
            "events": svg.stacked_bars(
                "Escalations, fallbacks and errors", times,
                {"escalated": [b.escalated for b in buckets],
                 "fallbacks": [b.fallbacks for b in buckets],
                 "errors": [b.errors for b in buckets]}, "calls",
            ),
        }  # fmt: skip
    return {
        "window": window,
        "windows": list(WINDOWS),
        "tenant": tenant,
        "tenants": _tenants(conn),
        "metrics": agent_metrics.compute(conn, group_by="tenant", tenant=tenant, since=since),
        "by_mix": agent_metrics.compute(conn, group_by="tier_mix", tenant=tenant, since=since),
        "by_version": agent_metrics.compute(
            conn, group_by="routing_version", tenant=tenant, since=since
        ),
        "latency": dashboard.latency(conn, since=since, tenant=tenant),
        "buckets": buckets,
        "charts": charts,
    }


def build_router(services: Services) -> APIRouter:
    router = APIRouter(prefix="/dashboard", include_in_schema=False)
    board = base.Dashboard(services)
    _pages(router, board)
    control_pages.register(router, board)
    approval_pages.register(router, board)
    _login(router, services)
    return router


def _pages(router: APIRouter, board: base.Dashboard) -> None:
    async def page(request: Request, name: str, page: str, fn: Any, *args: Any) -> Response:
        return await base.page(board, request, name, page, fn, *args)

    @router.get("")
    async def overview(
        request: Request, window: str = "24h", tenant: str | None = None
    ) -> Response:
        if window not in WINDOWS:
            window = "24h"
        return await page(request, "overview.html", "overview", _overview, window, tenant or None)

    @router.get("/sessions")
    async def session_list(
        request: Request, tenant: str | None = None, before: str | None = None
    ) -> Response:
        try:
            until = datetime.fromisoformat(before) if before else None
        except ValueError:
            until = None

        def read(conn: Connection) -> dict[str, Any]:
            rows = dashboard.recent_sessions(
                conn, tenant=tenant or None, limit=SESSIONS_PAGE, before=until
            )
            older = rows[-1]["created_at"].isoformat() if len(rows) == SESSIONS_PAGE else None
            return {"sessions": rows, "tenant": tenant, "older": older}

        return await page(request, "sessions.html", "sessions", read)

    @router.get("/sessions/{session_id}")
    async def session(request: Request, session_id: str) -> Response:
        def read(conn: Connection) -> dict[str, Any] | None:
            found = dashboard.episode(conn, session_id[:256])
            return None if found is None else {"s": found["session"], "steps": found["steps"]}

        return await page(request, "session.html", "sessions", read)


def _login(router: APIRouter, services: Services) -> None:
    @router.get("/login")
    async def login_form(request: Request) -> Response:
        return base.render("login.html", hours=base.COOKIE_HOURS)

    @router.post("/login")
    async def login(request: Request) -> Response:
        if not base.same_origin(request):
            return base.render(
                "login.html", 403, hours=base.COOKIE_HOURS, error="cross-site login refused"
            )
        if int(request.headers.get("content-length") or 0) > base.MAX_FORM:
            return base.render("login.html", 413, hours=base.COOKIE_HOURS, error="form too large")
        key = (await base.form(request)).get("key", "").strip()
        try:
            who = services.auth.authenticate(f"Bearer {key}")
        except AuthenticationFailed as exc:
            return base.render("login.html", 401, hours=base.COOKIE_HOURS, error=exc.message)
        if not who.admin:
            return base.render("login.html", 403, hours=base.COOKIE_HOURS, error="not an admin key")
        out = RedirectResponse("/dashboard", 303)
        out.set_cookie(
            base.COOKIE, key, max_age=base.COOKIE_HOURS * 3600, path="/dashboard", httponly=True,
            samesite="strict", secure=request.url.scheme == "https",
        )  # fmt: skip
        return out

    @router.post("/logout")
    async def logout(request: Request) -> Response:
        if not base.same_origin(request):
            return base.render(
                "base.html", 403, who=None, page="", error="cross-site request refused"
            )
        out = RedirectResponse("/dashboard/login", 303)
        out.delete_cookie(base.COOKIE, path="/dashboard")
        return out
