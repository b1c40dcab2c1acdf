"""The dashboard's approval queue: the tool calls that wait for a human, with Approve /
Deny: MCP tools with ``require_approval``, and the sandbox's own tools a grant holds for
approval (``server_label: "sandbox"``, a label no MCP server may take). A decision is stored
exactly as ``POST /admin/v1/approvals/{id}`` stores it, with ``approver:
"operator:<key name>"``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from fastapi import APIRouter, Request
from sqlalchemy import Connection
from starlette.responses import RedirectResponse, Response

from gateway.errors import GatewayError
from gateway.http.dashboard import base
from gateway.pipeline.responses.approvals import decision_item
from gateway.pipeline.responses.mcp_tools import SANDBOX_LABEL
from gateway.store import approvals as stored
from gateway.store.queries import NotFound


def _pending(conn: Connection) -> dict[str, Any]:
    return {
        "pending": stored.pending(conn),
        "when": lambda t: datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "sandbox": SANDBOX_LABEL,
    }


def register(router: APIRouter, board: base.Dashboard) -> None:
    @router.get("/approvals")
    async def queue(request: Request) -> Response:
        return await base.page(board, request, "approvals.html", "approvals", _pending)

    @router.post("/approvals/{ident}")
    async def answer(request: Request, ident: str) -> Response:
        who = base.acting(board, request)
        if isinstance(who, Response):
            return who
        fields = await base.form(request)
        if fields.get("approve") not in ("true", "false"):
            return base.render("base.html", 400, who=who, page="", error="approve or deny")
        approve = fields["approve"] == "true"
        reason = (fields.get("reason") or "").strip()[:4096] or None
        decision = decision_item(ident[:64], approve, reason, f"operator:{who.key_name}")
        try:
            done = await board.write(lambda conn: stored.decide(conn, ident[:64], decision))
        except NotFound as exc:
            return base.render("base.html", 404, who=who, page="approvals", error=str(exc))
        except GatewayError as exc:
            return base.render(
                "base.html", exc.status, who=who, page="approvals", error=exc.message
            )
        verb = "approved" if approve else "denied"
        notice = quote(f"{verb} {done['name']}")
        return RedirectResponse(f"/dashboard/approvals?done={notice}", 303)
