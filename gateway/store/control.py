"""The control plane's state in the store: routing versions and kill switches.

**Routing versions** are immutable and content-addressed: a version's id is the SHA-256 of
its canonical configuration (policy and parameters), so the same configuration is always
the same version, on every replica. What serves traffic is the latest ``routing_events``
row: every publish, rollback or canary change appends one holding the whole state after it
(the published version, the canary and its weight), who did it and why. The history is
therefore the audit log, and a rollback is one more event, never an edit.

**Kill switches** are rows keyed by (kind, target): ``all_to_full`` (every routed request to
the full tier), ``tier_off`` (a tier takes no traffic), ``tool_off`` (a hosted tool is
refused), ``sandbox_off`` (every hosted tool is refused), ``tenant_off`` (a tenant's keys are
refused). Each change also appends a ``kill_switch_events`` row: who, when, why.

Replicas poll ``changes`` (the two tables' highest event ids, one indexed read) and reload
when it moves (``gateway.routing.control``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal

import orjson
from sqlalchemy import Connection, func, insert, select, update

from gateway.store.rows import now_utc
from gateway.store.schema import (
    kill_switch_events,
    kill_switches,
    routing_events,
    routing_versions,
)

SwitchKind = Literal["all_to_full", "tier_off", "tool_off", "sandbox_off", "tenant_off"]
SWITCH_KINDS: tuple[SwitchKind, ...] = (
    "all_to_full", "tier_off", "tool_off", "sandbox_off", "tenant_off",
)  # fmt: skip
TARGETED = {"tier_off", "tool_off", "tenant_off"}


class ControlError(ValueError):
    """A control-plane change that cannot be made now (nothing to roll back, no canary)."""


class UnknownVersion(ControlError):
    """No routing version has that id."""


@dataclass(frozen=True, slots=True)
class RoutingState:
    published: str | None  # None: nothing published, the config file's router serves
    canary: str | None
    canary_weight: float
    event_id: int


def canonical(config: dict[str, Any]) -> bytes:
    return orjson.dumps(
        {"policy": config["policy"], "params": config.get("params") or {}},
        option=orjson.OPT_SORT_KEYS,
    )


def version_id(config: dict[str, Any]) -> str:
    return hashlib.sha256(canonical(config)).hexdigest()[:16]


def create_version(
    conn: Connection, config: dict[str, Any], actor: str, note: str | None = None
) -> tuple[str, bool]:
    """(id, created): the version of this configuration, stored unless it already is."""
    vid = version_id(config)
    if conn.execute(select(routing_versions.c.id).where(routing_versions.c.id == vid)).first():
        return vid, False
    conn.execute(
        insert(routing_versions).values(
            id=vid, config=orjson.loads(canonical(config)), note=note, created_by=actor,
            created_at=now_utc(),
        )
    )  # fmt: skip
    return vid, True


def versions(conn: Connection) -> list[dict[str, Any]]:
    rows = conn.execute(select(routing_versions).order_by(routing_versions.c.created_at.desc()))
    return [dict(r._mapping) for r in rows]


def version_configs(conn: Connection, ids: list[str]) -> dict[str, dict[str, Any]]:
    rows = conn.execute(
        select(routing_versions.c.id, routing_versions.c.config).where(
            routing_versions.c.id.in_(ids)
        )
    )
    return {r.id: r.config for r in rows}


def state(conn: Connection) -> RoutingState:
    row = conn.execute(select(routing_events).order_by(routing_events.c.id.desc()).limit(1)).first()
    if row is None:
        return RoutingState(None, None, 0.0, 0)
    return RoutingState(row.published, row.canary, float(row.canary_weight), int(row.id))


def events(conn: Connection, limit: int = 100) -> list[dict[str, Any]]:
    rows = conn.execute(select(routing_events).order_by(routing_events.c.id.desc()).limit(limit))
    return [dict(r._mapping) for r in rows]


def _known(conn: Connection, vid: str) -> None:
    if not conn.execute(select(routing_versions.c.id).where(routing_versions.c.id == vid)).first():
        raise UnknownVersion(f"no routing version {vid!r}")


def _append(
    conn: Connection, action: str, published: str, canary: str | None, weight: float,
    actor: str, note: str | None,
) -> RoutingState:  # fmt: skip
    new_id = conn.execute(
        insert(routing_events).values(
            action=action, published=published, canary=canary, canary_weight=weight,
            actor=actor, note=note, created_at=now_utc(),
        )
    ).inserted_primary_key  # fmt: skip
    assert new_id is not None
    return RoutingState(published, canary, weight, int(new_id[0]))


def publish(conn: Connection, vid: str, actor: str, note: str | None = None) -> RoutingState:
    """Serve ``vid`` to everyone; a canary of the same version ends with it."""
    _known(conn, vid)
    now = state(conn)
    canary, weight = (None, 0.0) if now.canary == vid else (now.canary, now.canary_weight)
    return _append(conn, "publish", vid, canary, weight, actor, note)


def published_stack(conn: Connection) -> list[str]:
    """The published versions as a stack: a publish pushes, a rollback pops. Rolling back
    twice after publishing A, B, C serves A, not B again."""
    stack: list[str] = []
    for action, published in conn.execute(
        select(routing_events.c.action, routing_events.c.published).order_by(routing_events.c.id)
    ):
        if action == "rollback" and stack:
            stack.pop()
        elif action == "publish" and (not stack or stack[-1] != published):
            stack.append(published)
    return stack


def rollback(conn: Connection, actor: str, note: str | None = None) -> RoutingState:
    """Back to the version published before the current one, canary ended."""
    stack = published_stack(conn)
    if not stack:
        raise ControlError("nothing is published: nothing to roll back")
    if len(stack) < 2:
        raise ControlError("no earlier published version to roll back to")
    return _append(conn, "rollback", stack[-2], None, 0.0, actor, note)


def set_canary(
    conn: Connection, vid: str, weight: float, actor: str, note: str | None = None
) -> RoutingState:
    """Serve ``vid`` to ``weight`` of the sessions (sticky per session)."""
    _known(conn, vid)
    if not 0.0 < weight < 1.0:
        raise ControlError("a canary's weight is between 0 and 1, exclusive")
    now = state(conn)
    if now.published is None:
        raise ControlError("publish a version before starting a canary against it")
    if now.published == vid:
        raise ControlError(f"{vid} is already published")
    return _append(conn, "canary", now.published, vid, weight, actor, note)


def end_canary(conn: Connection, actor: str, note: str | None = None) -> RoutingState:
    now = state(conn)
    if now.canary is None or now.published is None:
        raise ControlError("no canary is running")
    return _append(conn, "canary_off", now.published, None, 0.0, actor, note)


def _flatten(config: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(config, dict):  # an empty mapping has no leaves
        out: dict[str, Any] = {}
        for k in sorted(config):
            out.update(_flatten(config[k], f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: config}


def config_diff(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    """What changed between two configurations, by dotted path."""
    a, b = _flatten(old), _flatten(new)
    out = []
    for path in sorted(a.keys() | b.keys()):
        if path not in b:
            out.append({"path": path, "change": "removed", "from": a[path]})
        elif path not in a:
            out.append({"path": path, "change": "added", "to": b[path]})
        elif a[path] != b[path]:
            out.append({"path": path, "change": "changed", "from": a[path], "to": b[path]})
    return out


# -- kill switches -----------------------------------------------------------------------


def set_switch(
    conn: Connection,
    kind: SwitchKind,
    target: str,
    active: bool,
    actor: str,
    reason: str | None = None,
) -> dict[str, Any]:
    if kind not in SWITCH_KINDS:
        raise ControlError(f"kind must be one of {', '.join(SWITCH_KINDS)}")
    if (kind in TARGETED) != bool(target):
        raise ControlError(
            f"{kind} needs a target" if kind in TARGETED else f"{kind} takes no target"
        )
    now = now_utc()
    values = {"active": active, "reason": reason, "changed_by": actor, "changed_at": now}
    done = conn.execute(
        update(kill_switches)
        .where(kill_switches.c.kind == kind, kill_switches.c.target == target)
        .values(**values)
    )
    if done.rowcount == 0:
        conn.execute(insert(kill_switches).values(kind=kind, target=target, **values))
    conn.execute(
        insert(kill_switch_events).values(
            kind=kind, target=target, active=active, reason=reason, actor=actor, created_at=now
        )
    )
    return {"kind": kind, "target": target, **values}


def switches(conn: Connection, *, active_only: bool = False) -> list[dict[str, Any]]:
    q = select(kill_switches).order_by(kill_switches.c.kind, kill_switches.c.target)
    if active_only:
        q = q.where(kill_switches.c.active.is_(True))
    return [dict(r._mapping) for r in conn.execute(q)]


def switch_events(conn: Connection, limit: int = 100) -> list[dict[str, Any]]:
    rows = conn.execute(
        select(kill_switch_events).order_by(kill_switch_events.c.id.desc()).limit(limit)
    )
    return [dict(r._mapping) for r in rows]


def changes(conn: Connection) -> tuple[int, int]:
    """The highest routing and kill-switch event ids: what replicas poll."""
    r = conn.execute(
        select(
            select(func.coalesce(func.max(routing_events.c.id), 0)).scalar_subquery(),
            select(func.coalesce(func.max(kill_switch_events.c.id), 0)).scalar_subquery(),
        )
    ).one()
    return int(r[0]), int(r[1])
