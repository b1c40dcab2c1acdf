"""Everything a request may need, built once per app without I/O; ``start`` and ``close``
run in the app's lifespan. Routes and the completion pipeline receive it explicitly."""

from __future__ import annotations

import time

import aiohttp
from opentelemetry import trace

from gateway.access.admission import Admission
from gateway.access.sync import AccessSync
from gateway.auth import Authenticator
from gateway.config import Settings
from gateway.metrics import Metrics
from gateway.pipeline.context.stage import ContextStage
from gateway.recording.recorder import Recorder
from gateway.routing.calibration import TokenCalibrator
from gateway.routing.control import ControlPlane, ControlSync
from gateway.routing.recall import SessionRecall
from gateway.routing.sessions import RouteSessions
from gateway.store.worker import StoreWorker
from gateway.telemetry import build_tracer_provider
from gateway.upstream.dispatch import Dispatcher
from gateway.upstream.pool import TierPool
from gateway.upstream.scrape import Scraper
from gateway.upstream.transport import new_session
from router import Policy, Tier
from sandbox.client import SandboxClient


class Services:
    def __init__(
        self,
        settings: Settings,
        *,
        metrics: Metrics | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics or Metrics()
        self.auth = Authenticator(settings.auth)
        self.admission = Admission(self.auth, self.metrics, settings.limits.reserve_max_tokens)
        # one thread and engine for the copies below (gateway.store.worker)
        self.store_worker = StoreWorker(settings.store.url) if settings.store.enabled else None
        # keys, limits and budgets in the store (gateway.access); config-file keys without it
        self.access = (
            AccessSync(settings, self.auth, self.admission, self.store_worker)
            if self.store_worker is not None
            else None
        )
        # routing versions and kill switches: the config file's router until the store says
        # otherwise (gateway.routing.control)
        self.control = ControlPlane(settings.router)
        self.auth.suspended = self.control.tenant_off
        self.control_sync = (
            ControlSync(self.store_worker, self.control, settings.auth.refresh_s)
            if self.store_worker is not None
            else None
        )
        # a cache of the recorded steps' routing history (gateway.routing.recall)
        recall = (
            SessionRecall(self.store_worker, settings.router.recall_wait_s)
            if self.store_worker is not None and settings.router.recall
            else None
        )
        self.route_sessions = RouteSessions(
            settings.router.max_sessions, settings.router.session_ttl_s, recall
        )
        self.pools = {
            tier: TierPool(
                tier, ts.model, ts.replicas, settings.breaker, settings.health, fallback=ts.fallback
            )
            for tier, ts in settings.tiers.items()
        }
        self.scraper = Scraper(self.pools, self.metrics, settings.telemetry.scrape_interval_s)
        counted_by = self.pools.get(Tier.FULL) or next(iter(self.pools.values()), None)
        self.token_calibrator = TokenCalibrator(
            counted_by if settings.router.calibrate_tokens else None
        )
        self.tracer_provider = tracer_provider or build_tracer_provider(settings.telemetry)
        self.tracer = self.tracer_provider.get_tracer("gearshift")
        self.created = int(time.time())
        self.recorder = (
            Recorder(settings.store, self.metrics, settings.rewards.hooks)
            if settings.store.enabled
            else None
        )
        self.sandbox: SandboxClient | None = None  # when `serve` runs the tool sandbox
        self._session: aiohttp.ClientSession | None = None
        self._dispatcher: Dispatcher | None = None
        self.context = ContextStage(
            settings, self.pools, self.token_calibrator, lambda: self._dispatcher,
            lambda: self._session,
        )  # fmt: skip

    @property
    def dispatcher(self) -> Dispatcher:
        assert self._dispatcher is not None, "Services.start() was not called"
        return self._dispatcher

    async def start(self) -> None:
        if self.recorder is not None:
            await self.recorder.start()
        if self.store_worker is not None:  # after the recorder, which migrates the store
            await self.store_worker.open()
        if self.access is not None:
            await self.access.start()
        if self.control_sync is not None:
            await self.control_sync.start()
        sb = self.settings.sandbox
        if sb.enabled and sb.token is not None:  # run by `serve`, or a sandbox deployed apart
            socket = str(sb.socket) if sb.socket is not None and not sb.external else None
            url = sb.external or f"http://{sb.host}:{sb.port}"
            self.sandbox = SandboxClient(url, sb.token.get_secret_value(), socket=socket)
        self._session = new_session(self.settings.timeouts)
        self._dispatcher = Dispatcher(
            self.pools, self._session, self.settings.timeouts, self.settings.retries, self.metrics
        )
        for pool in self.pools.values():
            pool.start_health_checks(self._session)
        self.scraper.start(self._session)
        self.token_calibrator.start(self._session)

    async def close(self) -> None:
        await self.scraper.stop()
        await self.token_calibrator.stop()
        for pool in self.pools.values():
            await pool.stop()
        if self._session is not None:
            await self._session.close()
        if self.sandbox is not None:
            await self.sandbox.close()
        if self.recorder is not None:
            await self.recorder.close()  # after the pools: every finished step is queued
        if self.access is not None:  # after the pools: every ticket is settled
            await self.access.close()
        if self.control_sync is not None:
            await self.control_sync.close()
        if self.store_worker is not None:
            await self.store_worker.close()
        shutdown = getattr(self.tracer_provider, "shutdown", None)
        if shutdown is not None:
            shutdown()

    @property
    def policy(self) -> Policy:
        """The published routing version's policy (a canary's sessions may use another)."""
        return self.control.published.policy

    def ready(self) -> bool:
        return bool(self.pools) and all(p.ready() for p in self.pools.values())
