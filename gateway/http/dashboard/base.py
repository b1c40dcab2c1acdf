"""What every dashboard page shares: templates, the admin behind a request, store reads,
the same-origin check of forms."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.responses import HTMLResponse, RedirectResponse, Response

from gateway.auth import Principal
from gateway.errors import (
    AuthenticationFailed,
    GatewayError,
    PermissionDenied,
    StoreUnavailable,
)
from gateway.pipeline.services import Services
from gateway.recording.recorder import Recorder, RecorderClosed

COOKIE = "gearshift_dashboard"
COOKIE_HOURS = 8
MAX_FORM = 4096

_env = Environment(
    loader=FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)
_env.globals["pct"] = lambda v: "—" if v is None else f"{100 * v:.1f}%"
_env.globals["num"] = lambda v: "—" if v is None else f"{v:.2f}"


def render(name: str, status: int = 200, **context: Any) -> HTMLResponse:
    html = _env.get_template(name).render(**context)
    return HTMLResponse(html, status, headers={
        "cache-control": "no-store",
        "content-security-policy": "default-src 'none'; style-src 'unsafe-inline'; "
        "img-src 'self'; form-action 'self'; frame-ancestors 'none'",
        "x-content-type-options": "nosniff",
        "referrer-policy": "same-origin",
    })  # fmt: skip


class LoginNeeded(Exception):
    pass


class Dashboard:
    def __init__(self, services: Services) -> None:
        self.services = services

    def who(self, request: Request) -> Principal:
        """The admin behind a request, from its header or cookie."""
        auth = self.services.auth
        header = request.headers.get("authorization")
        cookie = request.cookies.get(COOKIE)
        if auth.enabled and not header and not cookie:
            raise LoginNeeded
        try:
            who = auth.authenticate(header or f"Bearer {cookie}")
        except AuthenticationFailed:
            if header:
                raise
            raise LoginNeeded from None
        if not who.admin:
            raise PermissionDenied("the dashboard is for admin keys")
        return who

    async def read(self, fn: Any, *args: Any) -> Any:
        """``fn(conn, *args)`` on the trajectory store (``Recorder.read``)."""
        try:
            return await self.recorder().read(lambda conn: fn(conn, *args))
        except RecorderClosed:
            raise StoreUnavailable(
                "the dashboard reads the trajectory store: not running"
            ) from None

    async def write(self, fn: Any) -> Any:
        """``fn(conn)`` in a transaction, in order with the Responses API's own store
        operations (``Recorder.direct``)."""
        try:
            return await self.recorder().direct(fn)
        except RecorderClosed:
            raise StoreUnavailable("the trajectory store is not running") from None

    def recorder(self) -> Recorder:
        if self.services.recorder is None:
            raise StoreUnavailable("the dashboard reads the trajectory store, which is off")
        return self.services.recorder


def same_origin(request: Request) -> bool:
    origin = request.headers.get("origin")
    if origin is None or origin == "null":
        return origin is None  # a browser's cross-site form sends one; curl sends none
    return urlsplit(origin).netloc == request.headers.get("host", "")


async def form(request: Request) -> dict[str, str]:
    """A small urlencoded form's fields (the first value of each); {} when too large."""
    body = await request.body()
    if len(body) > MAX_FORM:
        return {}
    return {k: v[0] for k, v in parse_qs(body.decode("latin-1")).items()}


async def page(
    board: Dashboard, request: Request, name: str, page: str, fn: Any, *args: Any
) -> Response:
    """Render ``name`` with what ``fn(conn, *args)`` read, as the admin behind ``request``."""
    try:
        who = board.who(request)
    except LoginNeeded:
        return RedirectResponse("/dashboard/login", 303)
    except (AuthenticationFailed, PermissionDenied) as exc:
        return render("base.html", exc.status, who=None, page=page, error=exc.message)
    try:
        context = await board.read(fn, *args)
    except GatewayError as exc:
        return render("base.html", exc.status, who=who, page=page, error=exc.message)
    if context is None:
        return render("base.html", 404, who=who, page=page, error="not found")
    notice = request.query_params.get("done")
    return render(name, who=who, page=page, notice=notice, **context)


def acting(board: Dashboard, request: Request) -> Principal | Response:
    """The admin behind a form's POST, or the response that refuses it (not logged in,
    not an admin, or a form posted from another site)."""
    try:
        who = board.who(request)
    except LoginNeeded:
        return RedirectResponse("/dashboard/login", 303)
    except (AuthenticationFailed, PermissionDenied) as exc:
        return render("base.html", exc.status, who=None, page="", error=exc.message)
    if not same_origin(request):
        return render("base.html", 403, who=who, page="", error="cross-site form refused")
    return who
