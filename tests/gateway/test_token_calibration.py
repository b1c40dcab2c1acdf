"""Fitting the router's prompt-token estimate to a tier's tokenizer (gateway.token_calibration).

Against the real tier (vLLM's /tokenize with the default model) in
tests/e2e/test_embedded_stack.py; here the fit itself, on counting rules it must recover,
and the wiring against a stand-in replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from gateway.config import Settings, TierSettings
from gateway.serving import Gateway
from gateway.token_calibration import PROBES, NoTokenizer, calibrate
from router import Tier
from router.tokens import DEFAULT, TokenModel, counts
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import serve_in_thread

OTHER_FAMILY = TokenModel(
    base=12, no_system=35, per_message=6, per_char=0.31, per_digit=0.4, per_symbol=0.6, tools=310,
    per_json_char=0.34, per_call=11, source="truth",
)  # fmt: skip


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
            gateway = Gateway(settings)
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
    gateway = Gateway(settings)
    assert gateway.token_calibrator.model is DEFAULT
