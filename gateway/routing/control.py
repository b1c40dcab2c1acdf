"""Each replica's copy of the control plane: which routing version serves a session, and
which kill switches are on.

The configuration file's router (``router.policy``/``params``) is the base version, used
until a version is published in the store (``gateway.store.control``). Every
``refresh_s`` a task reads the highest routing and kill-switch event ids (one indexed
read); when either moved it reloads the state, builds the policies of versions it has not
built yet, and swaps them in at once. A publish, rollback or switch therefore takes effect
on every replica within ``refresh_s`` plus one reload. If the store is away, the last
state stays in force.

A canary takes a share of *sessions*, not of requests: a session's key (its
``X-Session-Id`` or the hash chain of its history) hashes to a fixed point in [0, 1), so
every step of one agent run is routed by the same version.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from gateway.config import RouterSettings
from gateway.store import control
from gateway.store.worker import StoreWorker
from router import Policy, Tier, build_policy

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Version:
    id: str
    config: dict[str, Any]
    policy: Policy
    source: str  # "config" (the file) or "store"


def bucket(session_key: str) -> float:
    """A session's fixed point in [0, 1)."""
    digest = hashlib.blake2b(session_key.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


class ControlPlane:
    def __init__(self, settings: RouterSettings) -> None:
        config = {"policy": settings.policy, "params": settings.params}
        self.base = Version(
            control.version_id(config), config, build_policy(settings.policy, settings.params),
            "config",
        )  # fmt: skip
        self.published = self.base
        self.canary: Version | None = None
        self.canary_weight = 0.0
        self.event_ids = (0, 0)
        self._built: dict[str, Version] = {self.base.id: self.base}
        self._switches: frozenset[tuple[str, str]] = frozenset()

    # -- routing versions -------------------------------------------------------------

    def choose(self, session_key: str | None) -> Version:
        """The version that routes this session; a request that belongs to no session
        (nothing to keep it sticky by) gets the published one."""
        canary = self.canary
        if canary is not None and session_key and bucket(session_key) < self.canary_weight:
            return canary
        return self.published

    def version(self, vid: str, config: dict[str, Any]) -> Version:
        """The built version ``vid`` (building its policy once)."""
        found = self._built.get(vid)
        if found is None:
            policy = build_policy(config["policy"], config.get("params") or {})
            found = self._built[vid] = Version(vid, config, policy, "store")
        return found

    def apply(
        self,
        state: control.RoutingState,
        configs: dict[str, dict[str, Any]],
        switches: list[dict[str, Any]],
        event_ids: tuple[int, int],
    ) -> None:
        published = (
            self.version(state.published, configs[state.published])
            if state.published is not None
            else self.base
        )
        canary = self.version(state.canary, configs[state.canary]) if state.canary else None
        # one assignment each, no await in between: a request sees the old or the new state
        self.published, self.canary, self.canary_weight = published, canary, state.canary_weight
        self._switches = frozenset((s["kind"], s["target"]) for s in switches if s.get("active"))
        self.event_ids = event_ids

    # -- kill switches ----------------------------------------------------------------

    @property
    def all_to_full(self) -> bool:
        return ("all_to_full", "") in self._switches

    def tier_off(self, tier: Tier | str) -> bool:
        return ("tier_off", str(tier)) in self._switches

    def tool_off(self, tool: str) -> str | None:
        """Why a hosted tool may not run now, or None."""
        if ("sandbox_off", "") in self._switches:
            return "every hosted tool is switched off by an operator (kill switch sandbox_off)"
        if ("tool_off", tool) in self._switches:
            return f"the tool {tool!r} is switched off by an operator (kill switch tool_off)"
        return None

    def tenant_off(self, tenant: str) -> bool:
        return ("tenant_off", tenant) in self._switches

    def active_switches(self) -> list[tuple[str, str]]:
        return sorted(self._switches)


class ControlSync:
    """Keeps a ``ControlPlane`` in step with the store."""

    def __init__(self, worker: StoreWorker, plane: ControlPlane, refresh_s: float) -> None:
        self.worker, self.plane, self.refresh_s = worker, plane, refresh_s
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """After the store's schema is ready (the recorder migrates it) and the worker is
        open."""
        await self.refresh()
        self._task = self.worker.every(self.refresh_s, self.refresh, "control plane")

    async def close(self) -> None:
        await self.worker.cancel(self._task)
        self._task = None

    async def refresh(self) -> bool:
        """Reload when the store's events moved; True when it did."""
        return await self.worker.call(self._refresh, write=False)

    def _refresh(self, conn: Connection) -> bool:
        ids = control.changes(conn)
        if ids == self.plane.event_ids:
            return False
        state = control.state(conn)
        wanted = [v for v in (state.published, state.canary) if v is not None]
        configs = control.version_configs(conn, wanted)
        switches = control.switches(conn, active_only=True)
        self.plane.apply(state, configs, switches, ids)
        log.info(
            "control plane: routing version %s%s, kill switches %s",
            self.plane.published.id,
            f" (canary {state.canary} on {state.canary_weight:.0%} of sessions)"
            if state.canary
            else "",
            self.plane.active_switches() or "none",
        )
        return True

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(conn)`` in one transaction on the store's thread (the admin API's
        writes), then refresh at once so this replica applies its own change without
        waiting."""
        out = await self.worker.call(fn)
        await self.refresh()
        return out
