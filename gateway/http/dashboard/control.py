"""The dashboard's control pages: routing versions (diff, publish, canary, rollback) and
kill switches. Every button is a same-origin form whose action goes through the same store
functions as the admin API, recorded under the admin's key name."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from sqlalchemy import Connection
from starlette.responses import RedirectResponse, Response

from gateway.http.dashboard import base
from gateway.store import control

KINDS = (
    ("all_to_full", "every routed request to the full tier"),
    ("tier_off", "a tier takes no traffic (target: full or fast)"),
    ("tool_off", "a hosted tool is refused (target: its name)"),
    ("sandbox_off", "every hosted tool is refused"),
    ("tenant_off", "a tenant's keys are refused (target: the tenant)"),
)


def _routing(
    conn: Connection, board: base.Dashboard, a: str | None, b: str | None
) -> dict[str, Any]:
    plane = board.services.control
    state = control.state(conn)
    serving = {
        "published": state.published or plane.base.id,
        "source": "store" if state.published else "config",
        "canary": state.canary,
        "canary_weight": state.canary_weight,
    }
    versions = control.versions(conn)
    configs = {v["id"]: v["config"] for v in versions} | {plane.base.id: plane.base.config}
    shown = None
    if a and b and a in configs and b in configs:
        shown = {"from": a, "to": b, "changes": control.config_diff(configs[a], configs[b])}
    stack = control.published_stack(conn)
    return {
        "serving": serving,
        "versions": versions,
        "config_version": plane.base,
        "events": control.events(conn, 100),
        "diff": shown,
        "can_roll_back": len(stack) >= 2,
    }


def _switches(conn: Connection) -> dict[str, Any]:
    return {
        "switches": control.switches(conn),
        "events": control.switch_events(conn, 100),
        "kinds": KINDS,
    }


def _note(fields: dict[str, str]) -> str | None:
    return (fields.get("note") or "").strip()[:2000] or None


def _publish(c: Connection, actor: str, f: dict[str, str], tiers: set[str]) -> str:
    return f"published {control.publish(c, f.get('version', ''), actor, _note(f)).published}"


def _rollback(c: Connection, actor: str, f: dict[str, str], tiers: set[str]) -> str:
    return f"rolled back to {control.rollback(c, actor, _note(f)).published}"


def _canary(c: Connection, actor: str, f: dict[str, str], tiers: set[str]) -> str:
    try:
        weight = float(f.get("weight", ""))
    except ValueError:
        raise control.ControlError("the canary's weight must be a number") from None
    s = control.set_canary(c, f.get("version", ""), weight, actor, _note(f))
    return f"canary {s.canary} on {s.canary_weight:.0%} of sessions"


def _end_canary(c: Connection, actor: str, f: dict[str, str], tiers: set[str]) -> str:
    control.end_canary(c, actor, _note(f))
    return "canary ended"


def _switch(c: Connection, actor: str, f: dict[str, str], tiers: set[str]) -> str:
    kind, target = f.get("kind", ""), f.get("target", "").strip()
    if kind == "tier_off" and target not in tiers:
        raise control.ControlError(f"tier_off: target must be one of {sorted(tiers)}")
    active = f.get("active") == "true"
    reason = (f.get("reason") or "").strip()[:2000] or None
    control.set_switch(c, kind, target, active, actor, reason)  # type: ignore[arg-type]
    return f"{kind} {target} {'ON' if active else 'off'}".replace("  ", " ")


Change = Callable[[Connection, str, dict[str, str], set[str]], str]
ACTIONS: dict[str, tuple[str, Change]] = {
    "/routing/publish": ("routing", _publish),
    "/routing/rollback": ("routing", _rollback),
    "/routing/canary": ("routing", _canary),
    "/routing/canary/end": ("routing", _end_canary),
    "/switches": ("switches", _switch),
}


async def _act(board: base.Dashboard, request: Request, back: str, change: Change) -> Response:
    """Run a form's change as the admin behind it, then back to the page saying what
    happened (or show the error)."""
    who = base.acting(board, request)
    if isinstance(who, Response):
        return who
    fields = await base.form(request)
    sync = board.services.control_sync
    if sync is None:
        return base.render(
            "base.html", 503, who=who, page="", error="the control plane needs the store"
        )
    tiers = {str(t) for t in board.services.pools}
    try:
        done = await sync.call(lambda c: change(c, who.key_name, fields, tiers))
    except (control.ControlError, ValueError) as exc:
        return base.render("base.html", 400, who=who, page="", error=str(exc))
    return RedirectResponse(f"/dashboard/{back}?done={quote(done)}", 303)


def register(router: APIRouter, board: base.Dashboard) -> None:
    @router.get("/routing")
    async def routing(request: Request) -> Response:
        q = request.query_params
        return await base.page(
            board, request, "routing.html", "routing", _routing, board, q.get("from"), q.get("to")
        )

    @router.get("/switches")
    async def switches(request: Request) -> Response:
        return await base.page(board, request, "switches.html", "switches", _switches)

    for path, (back, change) in ACTIONS.items():
        router.add_api_route(path, _endpoint(board, back, change), methods=["POST"])


def _endpoint(
    board: base.Dashboard, back: str, change: Change
) -> Callable[[Request], Awaitable[Response]]:
    async def action(request: Request) -> Response:
        return await _act(board, request, back, change)

    return action
