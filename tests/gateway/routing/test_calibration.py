"""Fitting the router's prompt-token estimate to a tier's tokenizer (gateway.routing.calibration,
gateway.routing.refit).

Against the real tier (vLLM's /tokenize with the default model) in
tests/e2e/test_embedded_stack.py; here the fit itself, on counting rules it must recover,
and the wiring against a stand-in replica.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from bench.token_estimate import agent_sessions
from gateway.config import BreakerSettings, HealthSettings, Settings, TierSettings
from gateway.pipeline.services import Services
from gateway.routing.calibration import PROBES, NoTokenizer, TokenCalibrator, calibrate
from gateway.routing.refit import ServedWindow, _median, fit_weights, refit_from_traffic
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


def window_of(samples: Sequence[tuple[Counts, int]]) -> ServedWindow:
    window = ServedWindow(len(samples))
    for sizes, tokens in samples:
        window.add(sizes, tokens)
    return window


def test_weights_are_learnt_from_what_the_tier_counted_for_served_requests():
    found = refit_from_traffic(*window_of(served(OTHER_FAMILY, 300)).ordered(), DEFAULT)
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
    assert refit_from_traffic(*window_of(served(DEFAULT, 300)).ordered(), DEFAULT) is None


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
    found = refit_from_traffic(*window_of(english).ordered(), DEFAULT)
    assert found is not None
    model = found[0]
    assert DEFAULT.per_wide_byte > 0 and model.per_wide_byte == DEFAULT.per_wide_byte
    assert model.per_char == pytest.approx(OTHER_FAMILY.per_char, rel=0.05)  # the rest learnt
    assert fit_weights([[1.0, 2.0, 0.0], [1.0, 3.0, 0.0]], [5, 7])[2] == 0.0  # nothing to keep


def test_the_window_keeps_the_latest_requests_oldest_first():
    window = ServedWindow(3)
    sizes = [Counts(messages=1.0, chars=float(i)) for i in range(5)]
    window.add(sizes[0], 10)
    rows, truth = window.ordered()
    assert len(window) == 1 and rows.tolist() == [sizes[0].vector()] and truth.tolist() == [10]
    for i, c in enumerate(sizes[1:], start=1):
        window.add(c, 10 + i)
    rows, truth = window.ordered()
    assert len(window) == 3 and truth.tolist() == [12, 13, 14]
    assert rows.tolist() == [c.vector() for c in sizes[2:]]
    window.add(sizes[0], 99)  # a copy: what a refit already has stays as it was
    assert truth.tolist() == [12, 13, 14] and rows[:, 3].tolist() == [2, 3, 4]


def lstsq_fit(rows: list[list[float]], truth: list[int], keep: list[float]) -> list[float]:
    """The fit as it was before issue #29 (LAPACK's lstsq on the rows, each round): the
    reference the QR-once fit must agree with."""
    x, y = np.array(rows), np.array(truth, dtype=float)
    w = 1.0 / np.maximum(y, 1.0)
    unseen = [i for i in range(1, x.shape[1]) if not x[:, i].any()]
    free = [i for i in range(x.shape[1]) if i not in unseen]
    while True:
        fitted, *_ = np.linalg.lstsq(x[:, free] * w[:, None], y * w, rcond=None)
        weights = np.zeros(x.shape[1])
        weights[free] = fitted
        negative = [i for i in free[1:] if weights[i] < 0]
        if not negative:
            weights[unseen] = np.array(keep)[unseen]
            return [float(v) for v in weights]
        free.remove(min(negative, key=lambda i: weights[i]))


def python_refit(
    samples: list[tuple[Counts, int]], current: TokenModel
) -> tuple[list[float], float, float] | None:
    """``refit_from_traffic`` as it was, over a list of Counts with ``TokenModel``'s own
    estimate and the standard library's median."""
    cut = int(len(samples) * 0.8)
    rows, truth = [c.vector() for c, _ in samples], [t for _, t in samples]
    trial = TokenModel.from_weights(lstsq_fit(rows[:cut], truth[:cut], current.weights()), "")
    errors = [
        statistics.median(abs(m.estimate_counts(c) - t) / t for c, t in samples[cut:])
        for m in (trial, current)
    ]
    if errors[0] >= 0.9 * errors[1]:
        return None
    return lstsq_fit(rows, truth, current.weights()), errors[0], errors[1]


def random_traffic(seed: int, n: int) -> tuple[TokenModel, list[tuple[Counts, int]]]:
    """A counting rule, and requests of random sizes (a few empty, no wide bytes) counted
    by it with noise."""
    rng = random.Random(seed)
    truth = TokenModel.from_weights(
        [rng.uniform(0, 40), rng.uniform(0, 30), rng.uniform(2, 12), rng.uniform(0.15, 0.4),
         rng.uniform(0, 1), rng.uniform(-0.1, 0.6), rng.uniform(0, 300), rng.uniform(0.2, 0.4),
         rng.uniform(5, 25), 0.0],
        "truth",
    )  # fmt: skip
    samples = []
    for _ in range(n):
        chars = 0.0 if rng.random() < 0.03 else rng.uniform(1, 40_000)
        calls = float(rng.randint(0, 6))
        sizes = Counts(
            no_system=float(rng.random() < 0.3), messages=float(rng.randint(1, 30)) if chars else 0,
            chars=chars, digits=chars * rng.uniform(0, 0.1), symbols=chars * rng.uniform(0, 0.3),
            tools=float(calls > 0), json_chars=calls * rng.uniform(100, 3000), calls=calls,
        )  # fmt: skip
        exact = max(1, truth.estimate_counts(sizes))
        samples.append((sizes, max(1, round(exact * rng.uniform(0.8, 1.2)))))
    return truth, samples


@pytest.mark.parametrize("seed", range(6))
def test_the_array_refit_is_the_python_one(seed: int):
    """Issue #29: the refit moved from Python objects and LAPACK's lstsq to numpy arrays
    and one QR; it finds what it found before, kept weights included (no wide bytes)."""
    rule, samples = random_traffic(seed, 400)
    current = (DEFAULT, OTHER_FAMILY, rule)[seed % 3]  # the rule itself: nothing better
    expected = python_refit(samples, current)
    found = refit_from_traffic(*window_of(samples).ordered(), current)
    assert (found is None) == (expected is None)
    if found is not None and expected is not None:
        assert found[1:] == pytest.approx(expected[1:], rel=1e-9)
        assert found[0].weights() == pytest.approx(expected[0], rel=1e-7, abs=1e-9)
    rows = [c.vector() for c, _ in samples]
    truth = [t for _, t in samples]
    assert fit_weights(rows, truth, current.weights()) == pytest.approx(
        lstsq_fit(rows, truth, current.weights()), rel=1e-7, abs=1e-9
    )


def test_the_refit_median_is_numpys_and_imports_nothing_on_the_request_path():
    """np.median's first call imports numpy.ma (17 ms, in the refit's thread, holding the
    GIL while requests wait): the refit takes its medians without it, the same values."""
    rng = np.random.default_rng(7)
    for n in (1, 2, 3, 4, 5, 800, 801, 4000):
        for _ in range(20):
            values = rng.random(n) * rng.integers(1, 100)
            assert _median(values) == float(np.median(values))
    code = (
        "import sys\n"
        "import numpy as np\n"
        "from gateway.routing.refit import refit_from_traffic\n"
        "from router.tokens import DEFAULT\n"
        "rng = np.random.default_rng(0)\n"
        "rows = np.abs(rng.normal(size=(50, len(DEFAULT.weights())))) * 100\n"
        "rows[:, 0] = 1\n"
        "truth = np.maximum(1, rows @ np.array(DEFAULT.weights()))\n"
        "refit_from_traffic(rows, truth, DEFAULT)\n"
        "assert 'numpy.ma' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
