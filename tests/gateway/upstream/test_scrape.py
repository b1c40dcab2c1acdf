from __future__ import annotations

import aiohttp
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gateway.config import BreakerSettings, HealthSettings
from gateway.metrics import Metrics
from gateway.upstream.pool import TierPool
from gateway.upstream.scrape import Scraper, parse
from router import Tier
from tests.support.servers import serve_in_thread

# The shape of vLLM 0.32's exposition (counters carry _total and _created samples).
EXPOSITION = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} %(drafts)s
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} %(draft_tokens)s
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} %(accepted)s
"""


def test_parse_reads_spec_decoding_and_queue():
    stats = parse(EXPOSITION % {"drafts": 10, "draft_tokens": 40, "accepted": 30})
    assert (stats.drafts, stats.draft_tokens, stats.accepted_tokens) == (10, 40, 30)
    assert (stats.running, stats.waiting) == (2, 5)


async def test_scraper_exports_windowed_acceptance_rate():
    figures = {"drafts": 10, "draft_tokens": 40, "accepted": 30}

    async def metrics(request):
        return PlainTextResponse(EXPOSITION % figures)

    app = Starlette(routes=[Route("/metrics", metrics)])
    with serve_in_thread(app) as url:
        pool = TierPool(Tier.FAST, "m", [url], BreakerSettings(), HealthSettings())
        m = Metrics()
        scraper = Scraper({Tier.FAST: pool}, m, interval_s=1)
        async with aiohttp.ClientSession() as session:
            await scraper.scrape_once(session)
            assert (
                m.registry.get_sample_value(
                    "gearshift_spec_decode_acceptance_rate", {"tier": "fast"}
                )
                == 0.75
            )
            figures.update(
                drafts=20, draft_tokens=80, accepted=40
            )  # this window: 10 of 40 accepted
            await scraper.scrape_once(session)
    assert (
        m.registry.get_sample_value("gearshift_spec_decode_acceptance_rate", {"tier": "fast"})
        == 0.25
    )
    assert m.registry.get_sample_value("gearshift_spec_decode_draft_tokens", {"tier": "fast"}) == 80
    assert (
        m.registry.get_sample_value(
            "gearshift_replica_requests", {"tier": "fast", "replica": url, "state": "waiting"}
        )
        == 5
    )


# What kvplugin adds to a vLLM server's /metrics when KV compaction is on.
KV_EXPOSITION = """# HELP gearshift_kv_compactions_total Requests whose KV cache was compacted
# TYPE gearshift_kv_compactions_total counter
gearshift_kv_compactions_total 3.0
gearshift_kv_compactions_created 1.7e+09
# TYPE gearshift_kv_compaction_evicted_tokens_total counter
gearshift_kv_compaction_evicted_tokens_total 4200.0
# TYPE gearshift_kv_compaction_freed_blocks_total counter
gearshift_kv_compaction_freed_blocks_total 130.0
# TYPE gearshift_kv_compaction_seconds_total counter
gearshift_kv_compaction_seconds_total 0.25
"""


async def test_scraper_exports_kv_compaction_per_tier():
    async def metrics(request):
        return PlainTextResponse(
            KV_EXPOSITION + EXPOSITION % {"drafts": 0, "draft_tokens": 0, "accepted": 0}
        )

    app = Starlette(routes=[Route("/metrics", metrics)])
    with serve_in_thread(app) as url, serve_in_thread(app) as url2:
        pool = TierPool(Tier.FULL, "m", [url, url2], BreakerSettings(), HealthSettings())
        m = Metrics()
        async with aiohttp.ClientSession() as session:
            await Scraper({Tier.FULL: pool}, m, interval_s=1).scrape_once(session)
    figures = {"compactions": 6, "evicted_tokens": 8400, "freed_blocks": 260, "seconds": 0.5}
    for figure, value in figures.items():  # summed over the tier's two replicas
        labels = {"tier": "full", "figure": figure}
        assert m.registry.get_sample_value("gearshift_tier_kv_compaction", labels) == value
