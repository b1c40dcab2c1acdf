"""Fitting the router's prompt-token estimate to a tier's tokenizer (gateway.routing.calibration).

Against the real tier (vLLM's /tokenize with the default model) in
tests/e2e/test_embedded_stack.py; here the fit itself, on counting rules it must recover,
and the wiring against a stand-in replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from bench.token_estimate import agent_sessions
from gateway.config import BreakerSettings, HealthSettings, Settings, TierSettings
from gateway.pipeline.services import Services
from gateway.routing.calibration import (
    PROBES,
    NoTokenizer,
    TokenCalibrator,
    calibrate,
    fit_weights,
    refit_from_traffic,
)
from gateway.upstream.pool import TierPool
from router import Tier
from router.tokens import DEFAULT, Counts, TokenModel, counts
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import serve_in_thread

OTHER_FAMILY = TokenModel(
    base=12, no_system=35, per_message=6, per_char=0.31, per_digit=0.4, per_symbol=0.6, tools=310,
    per_json_char=0.34, per_call=11, source="truth",
)  # fmt: skip


TOOL_SPEC = PROBES[-1]["tools"][1]


def counted_by(model: TokenModel) -> Any:
    async def tokenize(body: Mapping[str, Any]) -> int:
        return model.estimate(body)

    return tokenize


def test_the_fit_recovers_a_linear_counting_rule():
    result = asyncio.run(calibrate(counted_by(OTHER_FAMILY), "test"))
    for fitted, true in zip(result.model.weights(), OTHER_FAMILY.weights(), strict=True):
        assert fitted == pytest.approx(true, rel=0.05, abs=0.5)
    assert result.fitted_error < 0.01
    assert result.default_error > 0.1  # the default family's weights would have been off
    assert result.uses_fit and result.model.source == "test"


def test_the_default_is_kept_where_it_counts_better():
    # a tier that counts exactly as DEFAULT does, give or take a token of noise: a fit to
    # 23 conversations cannot beat weights fitted to 1,700 requests
    async def default_family(body: Mapping[str, Any]) -> int:
        return DEFAULT.estimate(body) + (len(str(body)) % 3) - 1

    result = asyncio.run(calibrate(default_family, "test"))
    assert not result.uses_fit and result.model is DEFAULT


def test_the_calibration_set_varies_every_count():
    for name in ("no_system", "tools"):  # indicators
        assert {getattr(counts(b), name) for b in PROBES} == {0.0, 1.0}, name
    for name in ("messages", "chars", "digits", "symbols", "json_chars", "calls"):
        assert len({getattr(counts(b), name) for b in PROBES}) >= 3, name


def test_a_rule_the_counts_cannot_express_is_refused():
    async def erratic(body: Mapping[str, Any]) -> int:  # tokens unrelated to the text
        return 1 + (hash(str(body)) % 5000)

    with pytest.raises(ValueError):
        asyncio.run(calibrate(erratic, "test"))


def test_a_replica_without_tokenize_keeps_the_default():
    async def missing(body: Mapping[str, Any]) -> int:
        raise NoTokenizer("404")

    with pytest.raises(NoTokenizer):
        asyncio.run(calibrate(missing, "test"))


def test_the_gateway_routes_with_weights_fitted_to_its_full_tier():
    full, fast = FakeUpstream(), FakeUpstream()
    with serve_in_thread(full.app) as a, serve_in_thread(fast.app) as b:
        settings = Settings(
            tiers={
                Tier.FULL: TierSettings(model="m", replicas=[a]),
                Tier.FAST: TierSettings(model="m-fast", replicas=[b]),
            },
            store={"enabled": False},
        )

        async def scenario() -> tuple[TokenModel, TokenModel]:
            gateway = Services(settings)
            before = gateway.token_calibrator.model
            await gateway.start()
            try:
                for _ in range(200):
                    if gateway.token_calibrator.result is not None:
                        break
                    await asyncio.sleep(0.05)
                return before, gateway.token_calibrator.model
            finally:
                await gateway.close()

        before, after = asyncio.run(scenario())
    assert before is DEFAULT
    assert after.source == f"full tier ({a})"
    # the stand-in counts code points of the messages' JSON: about one token per character
    assert after.per_char == pytest.approx(1.0, abs=0.1)
    assert after.tools == 0  # it ignores tools: a zero weight, not a negative one


def test_calibration_can_be_turned_off():
    settings = Settings(
        tiers={Tier.FULL: TierSettings(model="m", replicas=["http://127.0.0.1:9"])},
        router={"calibrate_tokens": False},
        store={"enabled": False},
    )
    gateway = Services(settings)
    assert gateway.token_calibrator.model is DEFAULT


def served(model: TokenModel, n: int, seed: int = 0) -> list[tuple[Counts, int]]:
    """Requests of agent-session shapes, counted the way ``model`` counts."""
    bodies = agent_sessions(n, seed, [[TOOL_SPEC]]) + list(PROBES)
    return [(counts(b), model.estimate(b)) for b in bodies]


def test_weights_are_learnt_from_what_the_tier_counted_for_served_requests():
    found = refit_from_traffic(served(OTHER_FAMILY, 300), DEFAULT)
    assert found is not None
    model, trial_error, default_error = found
    assert trial_error < 0.01 < 0.1 < default_error
    assert model.source == f"{300 + len(PROBES)} requests served by the full tier"
    body = {
        "messages": [{"role": "user", "content": "How many 7s in 77077?"}],
        "tools": [TOOL_SPEC],
    }
    assert model.estimate(body) == pytest.approx(OTHER_FAMILY.estimate(body), rel=0.02)


def test_weights_that_already_count_well_are_kept():
    assert refit_from_traffic(served(DEFAULT, 300), DEFAULT) is None


def test_the_calibrator_refits_in_the_background_as_requests_are_served():
    pool = TierPool(Tier.FULL, "m", ["http://127.0.0.1:9"], BreakerSettings(), HealthSettings())
    samples = served(OTHER_FAMILY, 120, seed=3)

    async def scenario() -> TokenModel:
        calibrator = TokenCalibrator(pool, window=100, refit_every=100)
        assert calibrator.observe(samples[0][0], 0) is None  # no count: ignored
        assert calibrator.observe(Counts(token_ids=5), 5) is None  # token ids: nothing to learn
        for sizes, tokens in samples[:99]:
            calibrator.observe(sizes, tokens)
        assert calibrator.model is DEFAULT and calibrator._refitting is None
        calibrator.observe(*samples[99])
        assert calibrator._refitting is not None
        await calibrator._refitting
        return calibrator.model

    model = asyncio.run(scenario())
    assert model.source == "100 requests served by the full tier"
    sizes, tokens = samples[110]
    assert model.estimate_counts(sizes) == pytest.approx(tokens, rel=0.02)


def test_without_calibration_nothing_is_learnt():
    calibrator = TokenCalibrator(None, refit_every=1)
    sizes = counts({"messages": [{"role": "user", "content": "hi"}]})
    exact = DEFAULT.estimate_counts(sizes)
    # outside an event loop too: measured, no refit task started
    assert calibrator.observe(sizes, 2 * exact) == pytest.approx(0.5, abs=0.01)
    assert calibrator.model is DEFAULT and calibrator._refitting is None


def test_a_refit_on_traffic_in_one_script_keeps_what_it_cannot_see():
    """English-only traffic says nothing about the weight of wide bytes: a refit keeps the
    current one rather than dropping it to zero."""
    english = [(c, t) for c, t in served(OTHER_FAMILY, 300) if c.wide == 0]
    assert len(english) > 250
    found = refit_from_traffic(english, DEFAULT)
    assert found is not None
    model = found[0]
    assert DEFAULT.per_wide_byte > 0 and model.per_wide_byte == DEFAULT.per_wide_byte
    assert model.per_char == pytest.approx(OTHER_FAMILY.per_char, rel=0.05)  # the rest learnt
    assert fit_weights([[1.0, 2.0, 0.0], [1.0, 3.0, 0.0]], [5, 7])[2] == 0.0  # nothing to keep
