"""Dispatcher: replica choice, retries before the first byte, 429, breakers, fallback.

Real aiohttp against fake replicas on loopback; the backoff sleep is injected (recorded,
never slept), so every retry is visible in ``Rig.sleeps``.
"""

from __future__ import annotations

import asyncio
import time

import orjson
import pytest

from gateway.errors import (
    NoHealthyReplica,
    UpstreamError,
    UpstreamRateLimited,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.upstream.breaker import BreakerState
from gateway.upstream.dispatch import (
    Attempts,
    Completed,
    OpenStream,
    parse_retry_after,
    upstream_message,
)
from router import Tier
from tests.gateway.upstream.conftest import FAST_MODEL, FULL_MODEL, Payload, dead_url
from tests.support.fake_upstream import Behaviour, status

ERRORS = "gearshift_upstream_errors_total"
RETRIES = "gearshift_retries_total"
FALLBACKS = "gearshift_fallbacks_total"


async def eventually(check, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


async def dispatch(rig, attempts, *, stream=False, allow_fallback=False, payload=None):
    return await rig.dispatcher.dispatch(
        payload or Payload(stream),
        "/v1/chat/completions",
        stream,
        attempts,
        allow_fallback=allow_fallback,
        request_id="req-1",
    )


# -- the plain path ---------------------------------------------------------------------


async def test_a_healthy_replica_answers_in_one_attempt(fakes, rig):
    r = rig([fakes.a.url])
    att = Attempts(Tier.FULL)
    payload = Payload()
    result = await dispatch(r, att, payload=payload)
    assert isinstance(result, Completed) and result.status == 200
    assert orjson.loads(result.body)["model"] == FULL_MODEL
    assert payload.models == [FULL_MODEL] and fakes.a.requests[0]["model"] == FULL_MODEL
    assert (att.tier, att.fallback, att.count, att.replica) == (Tier.FULL, False, 1, fakes.a.url)
    assert att.upstream_s > 0
    replica = r.replica(Tier.FULL, fakes.a.url)
    assert replica.in_flight == 0 and replica.breaker.state is BreakerState.CLOSED
    assert r.sleeps == [] and r.metric(ERRORS, tier="full", kind="5xx") == 0


async def test_a_4xx_passes_through_untouched_and_is_not_retried(fakes, rig):
    fakes.a.then(status(400, message="bad temperature"))
    r = rig([fakes.a.url], threshold=1)
    att = Attempts(Tier.FULL)
    result = await dispatch(r, att)
    assert isinstance(result, Completed) and result.status == 400
    assert orjson.loads(result.body)["error"]["message"] == "bad temperature"
    assert att.count == 1 and len(fakes.a.requests) == 1 and r.sleeps == []
    # a client error is no fault of the replica: its breaker (threshold 1) stays closed
    assert r.replica(Tier.FULL, fakes.a.url).breaker.state is BreakerState.CLOSED


# -- 5xx and connect failures -----------------------------------------------------------


async def test_5xx_is_retried_with_exponential_backoff_until_an_answer(fakes, rig):
    fakes.a.then(status(500), status(503))
    r = rig([fakes.a.url])
    att = Attempts(Tier.FULL)
    result = await dispatch(r, att)
    assert isinstance(result, Completed) and result.status == 200
    assert att.count == 3 and len(fakes.a.requests) == 3
    assert len(r.sleeps) == 2
    assert 0.05 <= r.sleeps[0] <= 0.1 and 0.1 <= r.sleeps[1] <= 0.2  # base 0.1 s, doubling
    assert r.metric(ERRORS, tier="full", kind="5xx") == 2
    assert r.metric(RETRIES, tier="full", cause="5xx") == 2
    assert r.replica(Tier.FULL, fakes.a.url).breaker.state is BreakerState.CLOSED


async def test_backoff_is_time_waiting_on_replicas_not_gateway_overhead(fakes, rig):
    fakes.a.then(status(500))
    r = rig([fakes.a.url], backoff_takes_s=0.05)
    att = Attempts(Tier.FULL)
    result = await dispatch(r, att)
    assert isinstance(result, Completed) and result.status == 200 and r.sleeps
    assert att.upstream_s >= 0.05  # the overhead figure (elapsed - upstream_s) excludes it


async def test_a_retry_moves_to_a_replica_not_tried_yet(fakes, rig):
    fakes.a.then(status(500))
    fakes.b.then(status(500))
    r = rig([fakes.a.url, fakes.b.url], attempts=2)
    with pytest.raises(UpstreamError):
        await dispatch(r, Attempts(Tier.FULL))
    assert len(fakes.a.requests) == 1 and len(fakes.b.requests) == 1


async def test_5xx_on_every_attempt_is_a_502_naming_replica_and_status(fakes, rig):
    fakes.a.then(status(500), status(500), status(500))
    r = rig([fakes.a.url])
    att = Attempts(Tier.FULL)
    with pytest.raises(UpstreamError) as err:
        await dispatch(r, att)
    assert type(err.value) is UpstreamError and err.value.status == 502
    assert f"replica {fakes.a.url} returned 500: boom" in err.value.message
    assert att.count == 3
    assert len(r.sleeps) == 2  # no backoff after the last attempt
    assert r.metric(ERRORS, tier="full", kind="5xx") == 3
    assert r.metric(RETRIES, tier="full", cause="5xx") == 2
    assert r.replica(Tier.FULL, fakes.a.url).in_flight == 0


async def test_connect_failures_are_retried_until_the_breaker_opens(rig):
    url = dead_url()
    r = rig([url], threshold=2)
    att = Attempts(Tier.FULL)
    with pytest.raises(UpstreamUnreachable) as err:
        await dispatch(r, att)
    assert err.value.status == 502 and err.value.code == "upstream_unreachable"
    assert url in err.value.message
    replica = r.replica(Tier.FULL, url)
    # two failures open the circuit: the third attempt finds no eligible replica
    assert att.count == 2 and replica.breaker.state is BreakerState.OPEN
    assert not r.pools[Tier.FULL].available()
    assert r.metric(ERRORS, tier="full", kind="connect") == 2
    assert r.metric(RETRIES, tier="full", cause="connect") == 2
    assert replica.in_flight == 0


async def test_a_dead_replica_is_passed_over_for_a_live_one(fakes, rig):
    down = dead_url()
    r = rig([down, fakes.a.url])
    att = Attempts(Tier.FULL)
    result = await dispatch(r, att)
    assert isinstance(result, Completed) and result.status == 200
    assert att.replica == fakes.a.url and len(fakes.a.requests) == 1
    assert r.metric(ERRORS, tier="full", kind="connect") == att.count - 1


# -- 429 ------------------------------------------------------------------------------------


async def test_429_waits_for_retry_after_then_retries(fakes, rig):
    fakes.a.then(status(429, {"retry-after": "0.25"}))
    r = rig([fakes.a.url], threshold=1)
    att = Attempts(Tier.FULL)
    result = await dispatch(r, att)
    assert isinstance(result, Completed) and result.status == 200
    assert r.sleeps == [0.25] and att.count == 2
    assert r.metric(ERRORS, tier="full", kind="429") == 1
    assert r.metric(RETRIES, tier="full", cause="429") == 1
    # overload is not a replica fault: the breaker (threshold 1) did not open
    assert r.replica(Tier.FULL, fakes.a.url).breaker.state is BreakerState.CLOSED


async def test_429_with_retry_after_beyond_the_cap_goes_to_the_client_not_the_other_tier(
    fakes, rig
):
    fakes.a.then(status(429, {"retry-after": "120"}, message="slow down"))
    r = rig([fakes.a.url], [fakes.f.url], max_retry_after_s=10)
    att = Attempts(Tier.FULL)
    with pytest.raises(UpstreamRateLimited) as err:
        await dispatch(r, att, allow_fallback=True)
    assert err.value.status == 429 and err.value.headers == {"retry-after": "120"}
    assert "rate limited: slow down" in err.value.message
    assert r.sleeps == [] and att.count == 1
    assert (att.tier, att.fallback) == (Tier.FULL, False) and fakes.f.requests == []
    assert r.metric(FALLBACKS, from_tier="full", to_tier="fast") == 0


@pytest.mark.parametrize(
    "headers", [{}, {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}], ids=["none", "http-date"]
)
async def test_429_without_a_usable_retry_after_backs_off(fakes, rig, headers):
    fakes.a.then(status(429, headers))
    r = rig([fakes.a.url])
    result = await dispatch(r, Attempts(Tier.FULL))
    assert isinstance(result, Completed) and result.status == 200
    assert len(r.sleeps) == 1 and 0.05 <= r.sleeps[0] <= 0.1


async def test_429_on_the_last_attempt_goes_to_the_client_without_retry_after(fakes, rig):
    fakes.a.then(status(429))
    r = rig([fakes.a.url], attempts=1)
    with pytest.raises(UpstreamRateLimited) as err:
        await dispatch(r, Attempts(Tier.FULL))
    assert err.value.headers == {} and r.sleeps == []


@pytest.mark.parametrize(
    ("value", "seconds"),
    [("1.5", 1.5), ("0", 0.0), ("-3", 0.0), (None, None), ("Wed, 21 Oct 2015 07:28:00 GMT", None)],
)
def test_parse_retry_after(value, seconds):
    assert parse_retry_after(value) == seconds


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"error": {"message": "no such model"}}', "no such model"),
        (b'{"message": "flat"}', "flat"),
        (b"<html>bad gateway</html>", "<html>bad gateway</html>"),
        (b'{"error": "a string"}', '{"error": "a string"}'),
        (orjson.dumps({"error": {"message": "x" * 900}}), "x" * 500),
    ],
)
def test_upstream_message_reads_the_error_or_the_raw_body(body, message):
    assert upstream_message(body) == message


# -- timeouts ---------------------------------------------------------------------------


async def test_a_first_byte_timeout_is_neither_retried_nor_moved_and_hangs_up(fakes, rig):
    fakes.a.then(Behaviour(delay_s=5.0))  # the fake stops early when the gateway hangs up
    r = rig([fakes.a.url], [fakes.f.url], threshold=1, first_byte_s=0.2)
    att = Attempts(Tier.FULL)
    with pytest.raises(UpstreamTimeout) as err:
        await dispatch(r, att, allow_fallback=True)
    assert err.value.status == 504
    assert att.count == 1 and r.sleeps == [] and fakes.f.requests == []
    assert r.metric(ERRORS, tier="full", kind="timeout") == 1
    replica = r.replica(Tier.FULL, fakes.a.url)
    assert replica.breaker.state is BreakerState.OPEN and replica.in_flight == 0
    await eventually(lambda: fakes.a.fake.disconnects == 1)  # the replica saw the hang-up


async def test_a_connect_timeout_is_a_connect_failure_and_falls_back(fakes, rig, blackhole_url):
    r = rig([blackhole_url], [fakes.f.url], attempts=1, connect_s=0.2)
    att = Attempts(Tier.FULL)
    result = await dispatch(r, att, allow_fallback=True)
    assert isinstance(result, Completed) and result.status == 200
    assert (att.tier, att.fallback) == (Tier.FAST, True)


# -- fallback -------------------------------------------------------------------------------


async def test_a_failed_tier_falls_back_to_the_other_with_its_model(fakes, rig):
    r = rig([dead_url()], [fakes.f.url])
    att = Attempts(Tier.FULL)
    payload = Payload()
    result = await dispatch(r, att, allow_fallback=True, payload=payload)
    assert isinstance(result, Completed) and result.status == 200
    assert (att.tier, att.fallback, att.replica) == (Tier.FAST, True, fakes.f.url)
    assert att.count == 4  # three on the full tier, one on the fast
    assert payload.models == [FULL_MODEL, FAST_MODEL]
    assert fakes.f.requests[0]["model"] == FAST_MODEL
    assert r.metric(FALLBACKS, from_tier="full", to_tier="fast") == 1


async def test_a_tier_without_eligible_replicas_falls_back_without_an_attempt(fakes, rig):
    r = rig([fakes.a.url], [fakes.f.url])
    r.replica(Tier.FULL, fakes.a.url).healthy = False
    att = Attempts(Tier.FULL)
    result = await dispatch(r, att, allow_fallback=True)
    assert isinstance(result, Completed) and result.status == 200
    assert (att.tier, att.fallback, att.count) == (Tier.FAST, True, 1)
    assert fakes.a.requests == []


@pytest.mark.parametrize("why", ["pinned", "tier_refuses", "one_tier"])
async def test_no_fallback_when_not_allowed(fakes, rig, why):
    down = dead_url()
    r = rig([down], None if why == "one_tier" else [fakes.f.url], fallback=why != "tier_refuses")
    att = Attempts(Tier.FULL)
    with pytest.raises(UpstreamUnreachable):
        await dispatch(r, att, allow_fallback=why != "pinned")
    assert (att.tier, att.fallback) == (Tier.FULL, False) and fakes.f.requests == []
    assert r.metric(FALLBACKS, from_tier="full", to_tier="fast") == 0


async def test_no_healthy_replica_and_no_fallback_is_a_503_without_an_attempt(fakes, rig):
    r = rig([fakes.a.url])
    r.replica(Tier.FULL, fakes.a.url).healthy = False
    att = Attempts(Tier.FULL)
    with pytest.raises(NoHealthyReplica) as err:
        await dispatch(r, att, allow_fallback=True)
    assert err.value.status == 503 and "tier full has no healthy replica" in err.value.message
    assert att.count == 0 and att.replica is None and fakes.a.requests == []


async def test_both_tiers_down_raises_the_second_tiers_error(fakes, rig):
    r = rig([dead_url()], [fakes.f.url])
    r.replica(Tier.FAST, fakes.f.url).healthy = False
    att = Attempts(Tier.FULL)
    with pytest.raises(NoHealthyReplica, match="tier fast"):
        await dispatch(r, att, allow_fallback=True)
    assert (att.tier, att.fallback, att.count) == (Tier.FAST, True, 3)


async def test_fast_tier_fallback_is_counted_under_its_own_labels(fakes, rig):
    r = rig([fakes.a.url], [dead_url()])
    att = Attempts(Tier.FAST)
    await dispatch(r, att, allow_fallback=True)
    assert (att.tier, att.fallback) == (Tier.FULL, True)
    assert r.metric(FALLBACKS, from_tier="fast", to_tier="full") == 1
    assert r.metric(ERRORS, tier="fast", kind="connect") == 3


# -- streams --------------------------------------------------------------------------------


async def test_a_stream_is_handed_over_once_its_first_event_arrived(fakes, rig):
    r = rig([fakes.a.url])
    att = Attempts(Tier.FULL)
    result = await dispatch(r, att, stream=True)
    try:
        assert isinstance(result, OpenStream) and result.response.status == 200
        assert result.first_events and result.first_events[0].startswith(b"data: {")
        assert all(e.endswith(b"\n\n") for e in result.first_events)
        assert b"\n\n" not in result.rest  # only the incomplete tail is left over
        assert result.replica.url == fakes.a.url
        assert result.replica.in_flight == 1  # the relay owns it now
        assert result.replica.breaker.state is BreakerState.CLOSED and att.count == 1
    finally:
        result.response.close()


async def test_a_stream_refused_with_an_error_status_is_a_completed_answer(fakes, rig):
    fakes.a.then(status(400, message="bad stream"))
    r = rig([fakes.a.url])
    result = await dispatch(r, Attempts(Tier.FULL), stream=True)
    assert isinstance(result, Completed) and result.status == 400
    assert r.replica(Tier.FULL, fakes.a.url).in_flight == 0


async def test_a_stream_cut_before_its_first_event_is_retried(fakes, rig):
    fakes.a.then(Behaviour("cut", after=-1))
    r = rig([fakes.a.url])
    att = Attempts(Tier.FULL)
    result = await dispatch(r, att, stream=True)
    try:
        assert isinstance(result, OpenStream) and att.count == 2
        assert r.metric(ERRORS, tier="full", kind="connect") == 1
        assert r.metric(RETRIES, tier="full", cause="connect") == 1
    finally:
        result.response.close()


async def test_a_stream_stalled_before_its_first_event_times_out(fakes, rig):
    fakes.a.then(Behaviour("stall"))
    r = rig([fakes.a.url], first_byte_s=0.2)
    att = Attempts(Tier.FULL)
    with pytest.raises(UpstreamTimeout):
        await dispatch(r, att, stream=True)
    assert att.count == 1 and r.replica(Tier.FULL, fakes.a.url).in_flight == 0
    await eventually(lambda: fakes.a.fake.disconnects == 1)


# -- circuit breaker, half-open ---------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def open_breaker(fakes, rig, clock):
    """A one-replica tier whose circuit (threshold 1, reset 10 s) was opened by a 500."""
    fakes.a.then(status(500))
    r = rig([fakes.a.url], threshold=1, attempts=1, clock=clock)
    with pytest.raises(UpstreamError):
        await dispatch(r, Attempts(Tier.FULL))
    replica = r.replica(Tier.FULL, fakes.a.url)
    assert replica.breaker.state is BreakerState.OPEN
    return r, replica


async def test_an_open_circuit_refuses_then_lets_one_trial_through(fakes, rig):
    clock = Clock()
    r, replica = await open_breaker(fakes, rig, clock)
    with pytest.raises(NoHealthyReplica):
        await dispatch(r, Attempts(Tier.FULL))
    assert len(fakes.a.requests) == 1
    clock.now += 10
    result = await dispatch(r, Attempts(Tier.FULL))
    assert isinstance(result, Completed) and result.status == 200
    assert replica.breaker.state is BreakerState.CLOSED


async def test_a_failed_trial_opens_the_circuit_again(fakes, rig):
    clock = Clock()
    r, replica = await open_breaker(fakes, rig, clock)
    clock.now += 10
    fakes.a.then(status(502))
    with pytest.raises(UpstreamError):
        await dispatch(r, Attempts(Tier.FULL))
    assert replica.breaker.state is BreakerState.OPEN and not replica.eligible()


async def test_a_429_on_the_trial_gives_the_slot_back(fakes, rig):
    clock = Clock()
    r, replica = await open_breaker(fakes, rig, clock)
    clock.now += 10
    fakes.a.then(status(429, {"retry-after": "600"}))
    with pytest.raises(UpstreamRateLimited):
        await dispatch(r, Attempts(Tier.FULL))
    assert replica.breaker.state is BreakerState.HALF_OPEN and replica.eligible()


async def test_a_cancelled_trial_gives_the_slot_back(fakes, rig):
    clock = Clock()
    r, replica = await open_breaker(fakes, rig, clock)
    clock.now += 10
    fakes.a.then(Behaviour(delay_s=5.0))
    task = asyncio.ensure_future(dispatch(r, Attempts(Tier.FULL)))
    await eventually(lambda: len(fakes.a.requests) == 2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert replica.in_flight == 0
    assert replica.eligible(), f"{replica} is stuck half-open with its trial taken"
