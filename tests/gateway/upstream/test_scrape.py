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
