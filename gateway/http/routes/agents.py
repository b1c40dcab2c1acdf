"""The five agent metrics for operators: over the admin API, and as Prometheus gauges.

    GET /admin/v1/agent-metrics?window=24h&group_by=tenant|agent|tier_mix[&tenant=…]
    GET /admin/v1/agent-metrics?since=<ISO time>&until=<ISO time>&group_by=…

The figures (``gateway.store.agent_metrics``) are computed by the database from the
trajectory store, so every replica answers the same. For Prometheus, a task recomputes
them per tenant and agent over the last hour (every ``METRICS_EVERY_S``) and the last day
(every ``REFRESH_TICKS["24h"]`` of those), and ``/metrics`` serves that snapshot: a scrape
never waits on the store. The query runs on the recorder's low-priority reader thread, so on
a busy core requests go first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi import APIRouter, Request
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.errors import InvalidRequest, PermissionDenied, StoreUnavailable
from gateway.pipeline.services import Services
from gateway.recording.recorder import RecorderClosed
from gateway.store import agent_metrics
from gateway.store.agent_metrics import GROUPS, AgentMetrics, GroupBy

log = logging.getLogger(__name__)

METRICS_EVERY_S = 30.0
EXPORTED_WINDOWS = {"1h": timedelta(hours=1), "24h": timedelta(days=1)}
# Refreshes of each window, in ticks of METRICS_EVERY_S: a day's figures cost ~24 times an
# hour's to compute and move slowly (docs/decisions/agent-metrics-refresh.md).
REFRESH_TICKS = {"1h": 1, "24h": 10}
MAX_WINDOW = timedelta(days=366)
_WINDOW = re.compile(r"^(\d{1,4})([mhd])$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}

# (metric name, help, AgentMetrics field)
GAUGES = (
    ("gearshift_agent_task_success_rate", "Share of sessions with a verdict that succeeded",
     "task_success_rate"),
    ("gearshift_agent_steps_per_session", "Model calls per session", "avg_steps"),
    ("gearshift_agent_tool_failure_rate", "Share of answered tool calls that failed, were "
     "denied or timed out", "tool_failure_rate"),
    ("gearshift_agent_timeout_rate", "Tool and model timeouts over tool and model calls",
     "timeout_rate"),
    ("gearshift_agent_satisfaction", "Mean user feedback score", "satisfaction"),
    ("gearshift_agent_sessions", "Sessions started in the window", "sessions"),
    ("gearshift_agent_fast_step_share", "Share of model calls served by the fast tier",
     "fast_step_share"),
)  # fmt: skip


def parse_window(window: str) -> timedelta:
    m = _WINDOW.match(window)
    if m is None:
        raise InvalidRequest("window must look like 30m, 24h or 7d", param="window")
    span = timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})
    if not timedelta(0) < span <= MAX_WINDOW:
        raise InvalidRequest("window must be between 1m and 366d", param="window")
    return span


def _time(value: str, name: str) -> datetime:
    try:
        t = datetime.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(f"{name} must be an ISO 8601 time", param=name) from None
    return t if t.tzinfo is not None else t.replace(tzinfo=UTC)


class AgentMetricsExporter(Collector):
    """Keeps the latest per-agent figures for ``/metrics``; registered on the gateway's
    registry, refreshed by a task while the gateway runs."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self._snapshot: dict[str, list[AgentMetrics]] = {}
        self._task: asyncio.Task[None] | None = None
        self.refreshed_at: float | None = None
        services.metrics.registry.register(self)

    def describe(self) -> list[Any]:
        return []  # collected lazily: the registry must not call collect() on register

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for name, doc, field in GAUGES:
            family = GaugeMetricFamily(name, doc, labels=["tenant", "agent", "window"])
            for window, rows in self._snapshot.items():
                for row in rows:
                    value = getattr(row, field)
                    if value is not None:
                        family.add_metric(
                            [row.group["tenant"], row.group["agent"], window], float(value)
                        )
            yield family

    def start(self) -> None:
        if self.services.recorder is not None and self._task is None:
            self._task = asyncio.create_task(self._run(), name="agent-metrics")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def refresh(self, tick: int = 0) -> None:
        """Recompute the windows due at ``tick`` (every window at tick 0)."""
        now = datetime.now(UTC)
        snapshot = dict(self._snapshot)
        for window, span in EXPORTED_WINDOWS.items():
            if tick % REFRESH_TICKS[window] == 0 or window not in snapshot:
                snapshot[window] = await self.read("agent", None, now - span, None, low=True)
        self._snapshot, self.refreshed_at = snapshot, time.time()

    async def _run(self) -> None:
        tick = 0
        while True:
            try:
                await self.refresh(tick)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the store may be briefly away: keep the last figures
                log.warning("agent metrics not refreshed: %s", exc)
            tick += 1
            await asyncio.sleep(METRICS_EVERY_S)

    async def read(
        self,
        group_by: GroupBy,
        tenant: str | None,
        since: datetime | None,
        until: datetime | None,
        low: bool = False,
    ) -> list[AgentMetrics]:
        """``low``: on the recorder's low-priority reader (the exporter's refresh)."""
        recorder = self.services.recorder
        if recorder is None:
            raise StoreUnavailable("the trajectory store is off")
        try:
            return await recorder.read(
                lambda conn: agent_metrics.compute(
                    conn, group_by=group_by, tenant=tenant, since=since, until=until
                ),
                low=low,
            )
        except RecorderClosed:
            raise StoreUnavailable("the trajectory store is not running") from None


def build_router(services: Services, exporter: AgentMetricsExporter) -> APIRouter:
    router = APIRouter(prefix="/admin/v1")

    @router.get("/agent-metrics")
    async def metrics(request: Request) -> dict[str, Any]:
        who = services.auth.authenticate(request.headers.get("authorization"))
        if not who.admin:
            raise PermissionDenied("the agent metrics are for admin keys")
        q = request.query_params
        unknown = sorted(set(q) - {"window", "since", "until", "group_by", "tenant"})
        if unknown:
            raise InvalidRequest(f"unknown query parameter {unknown[0]!r}", param=unknown[0])
        group_by = q.get("group_by", "tenant")
        if group_by not in GROUPS:
            raise InvalidRequest(f"group_by must be one of {', '.join(GROUPS)}", param="group_by")
        now = datetime.now(UTC)
        if "since" in q and "window" in q:
            raise InvalidRequest("give window or since, not both", param="since")
        until = _time(q["until"], "until") if "until" in q else None
        since = (
            _time(q["since"], "since")
            if "since" in q
            else (until or now) - parse_window(q.get("window", "24h"))
        )
        if until is not None and until <= since:
            raise InvalidRequest("until must be after since", param="until")
        tenant = q.get("tenant") or None
        rows = await exporter.read(group_by, tenant, since, until)
        return {
            "object": "list",
            "since": since.isoformat(),
            "until": (until or now).isoformat(),
            "group_by": group_by,
            "data": [r.as_dict() for r in rows],
        }

    return router
