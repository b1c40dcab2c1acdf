"""Engine statistics scraped from each replica's Prometheus ``/metrics``.

Speculative decoding (drafts, draft tokens, accepted tokens), queue depth (requests
running and waiting) and KV-cache compaction (docs/kv-compaction.md) per tier,
re-exported by the gateway so that dashboards and, later, load-aware routing see them in
one place. Scraped every ``telemetry.scrape_interval_s``,
off the request path; a replica that does not answer keeps its last figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp

from gateway.metrics import Metrics
from gateway.upstream.pool import TierPool
from kvplugin.metrics import COUNTERS as KV_COUNTERS
from router.types import Tier

log = logging.getLogger(__name__)

COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
}
# KV-cache compaction (kvplugin.metrics: counted by the plugin in vLLM's API server)
COUNTERS |= {name: f"kv_{field or 'compactions'}" for name, field in KV_COUNTERS.items()}
KV_FIGURES = ("kv_compactions", "kv_evicted_tokens", "kv_freed_blocks", "kv_seconds")
GAUGES = {"vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting"}


@dataclass
class EngineStats:
    """One replica's figures: cumulative spec-decoding counters and current queue."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    kv_compactions: float = 0.0
    kv_evicted_tokens: float = 0.0
    kv_freed_blocks: float = 0.0
    kv_seconds: float = 0.0


def parse(text: str) -> EngineStats:
    """Sum the samples of the metrics we use across label sets (one per engine/model).

    A plain line reader: counters are matched by their ``_total`` samples, gauges by name.
    """
    stats = EngineStats()
    wanted = {f"{k}_total": v for k, v in COUNTERS.items()} | GAUGES
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        field_name = wanted.get(name)
        if field_name is None:
            continue
        rest = line[line.rfind("}") + 1 :] if "}" in line else line[len(name) :]
        totals[field_name] = totals.get(field_name, 0.0) + float(
            rest.split()[0]
        )  # value [timestamp]
    for field_name, value in totals.items():
        setattr(stats, field_name, value)
    return stats


@dataclass
class TierStats:
    """A tier's figures summed over replicas, with the acceptance rate of the last window."""

    replicas: dict[str, EngineStats] = field(default_factory=dict)
    acceptance_rate: float | None = None  # accepted / draft tokens since the previous scrape

    def total(self, name: str) -> float:
        return float(sum(getattr(s, name) for s in self.replicas.values()))


class Scraper:
    def __init__(self, pools: Mapping[Tier, TierPool], metrics: Metrics, interval_s: float) -> None:
        self._pools = pools
        self._metrics = metrics
        self._interval_s = interval_s
        self._timeout = aiohttp.ClientTimeout(total=min(5.0, interval_s))
        self.tiers: dict[Tier, TierStats] = {tier: TierStats() for tier in pools}
        self._task: asyncio.Task[None] | None = None

    async def scrape_once(self, session: aiohttp.ClientSession) -> None:
        for tier, pool in self._pools.items():
            stats = self.tiers[tier]
            before = (stats.total("draft_tokens"), stats.total("accepted_tokens"))
            for replica in pool.replicas:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    async with session.get(replica.url + "/metrics", timeout=self._timeout) as resp:
                        if resp.status == 200:
                            stats.replicas[replica.url] = parse(await resp.text())
            drafted = stats.total("draft_tokens") - before[0]
            if drafted > 0:
                stats.acceptance_rate = (stats.total("accepted_tokens") - before[1]) / drafted
            self._export(tier, stats)

    def _export(self, tier: Tier, stats: TierStats) -> None:
        m, t = self._metrics, str(tier)
        m.spec_drafts.labels(t).set(stats.total("drafts"))
        m.spec_draft_tokens.labels(t).set(stats.total("draft_tokens"))
        m.spec_accepted_tokens.labels(t).set(stats.total("accepted_tokens"))
        if stats.acceptance_rate is not None:
            m.spec_acceptance_rate.labels(t).set(stats.acceptance_rate)
        for figure in KV_FIGURES:
            m.kv_compaction.labels(t, figure.removeprefix("kv_")).set(stats.total(figure))
        for url, s in stats.replicas.items():
            m.replica_queue.labels(t, url, "running").set(s.running)
            m.replica_queue.labels(t, url, "waiting").set(s.waiting)

    def start(self, session: aiohttp.ClientSession) -> None:
        self._task = asyncio.create_task(self._loop(session), name="scrape-engines")

    async def _loop(self, session: aiohttp.ClientSession) -> None:
        while True:
            await self.scrape_once(session)
            await asyncio.sleep(self._interval_s)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
