"""classifier, budget, load_aware and session policies: each on its own, deterministic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from router import PolicyError, RouteRequest, Tier, build_policy
from router.training import Example, fit
from router.types import LoadSignals, SessionState
from tests.router.conftest import synthetic

HARD = {"messages": [{"role": "user", "content": "Compute 48213 * 99121 and then add 417."}]}
EASY = {"messages": [{"role": "user", "content": "tell me about the river please"}]}


def req(body: dict, **kw: object) -> RouteRequest:
    return RouteRequest("chat", body, **kw)  # type: ignore[arg-type]


def test_classifier_policy_routes_and_explains(model_file: Path):
    policy = build_policy("classifier", {"model": str(model_file)})
    hard, easy = policy.decide(req(HARD)), policy.decide(req(EASY))
    assert hard.tier is Tier.FULL and easy.tier is Tier.FAST
    assert hard.score is not None and hard.threshold is not None and hard.score >= hard.threshold
    assert hard.reason.startswith("classifier: p(full)=") and "top: " in hard.reason
    assert hard.propensity == 1.0 and "log_numbers" in hard.features
    assert policy.decide(req(HARD)) == hard  # deterministic


def test_threshold_is_tunable(model_file: Path):
    everything = build_policy("classifier", {"model": str(model_file), "threshold": 0.0})
    nothing = build_policy("classifier", {"model": str(model_file), "threshold": 1.0})
    assert everything.decide(req(EASY)).tier is Tier.FULL
    assert nothing.decide(req(HARD)).tier is Tier.FAST


def test_exploration_is_deterministic_and_sets_propensity(model_file: Path):
    policy = build_policy("classifier", {"model": str(model_file), "explore": 0.5})
    tiers = []
    for i in range(40):
        d = policy.decide(req(EASY, session_id=f"s{i}"))
        assert d.propensity == 0.5
        assert d == policy.decide(req(EASY, session_id=f"s{i}"))
        tiers.append(d.tier)
    assert 5 < tiers.count(Tier.FULL) < 35  # about half explored
    plain = build_policy("classifier", {"model": str(model_file), "explore": 0.1})
    d = plain.decide(req(EASY, session_id="x"))
    assert d.propensity in (0.9, 0.1)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("classifier", {"threshold": 2}, "threshold must be a number between 0 and 1"),
        ("classifier", {"explore": 0.7}, "explore above 0.5"),
        ("classifier", {"model": "/nonexistent.json"}, "cannot load the router model"),
        ("classifier", {"colour": 1}, "unknown parameters"),
        ("classifier", {"sampled_from": 3}, "sampled_from must be a temperature between 0 and 2"),
        ("classifier", {"sampled_threshold": 0.2}, "sampled_threshold needs a sampled_model"),
        ("classifier", {"sampled_model": "/nonexistent.json"}, r"router model \(sampled_model\)"),
        ("budget", {"fast_share": -1}, "fast_share must be"),
        ("budget", {"window": 0}, "window must be a positive integer"),
        ("budget", {"window": 10, "min_samples": 20}, "min_samples cannot exceed window"),
        ("load_aware", {"queue_scale": 0}, "queue_scale must be a positive number"),
        ("session", {"base": "session"}, "base cannot be 'session'"),
        ("session", {"base": "always_fast", "cooldown_steps": -1}, "cooldown_steps"),
        ("session", {"base": "always_fast", "sticky": "yes"}, "sticky must be true or false"),
    ],
)
def test_bad_parameters_are_named(model_file: Path, name: str, params: dict, message: str):
    if name != "session" and "model" not in params:
        params = {**params, "model": str(model_file)}
    with pytest.raises(PolicyError, match=message):
        build_policy(name, params)


@pytest.fixture(scope="module")
def inverted_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model that learned the opposite: chit-chat needs the full tier, arithmetic not."""
    flipped = [Example(e.id, e.body, 1.0, 1.0 if e.label() else 0.0, e.group) for e in synthetic()]
    path = tmp_path_factory.mktemp("router") / "inverted.json"
    path.write_text(json.dumps(fit(flipped, l2_grid=(0.01,), folds=3)))
    return path


def test_sampled_requests_are_scored_by_the_sampled_model(model_file: Path, inverted_file: Path):
    policy = build_policy(
        "classifier", {"model": str(model_file), "sampled_model": str(inverted_file)}
    )
    greedy, sampled = {**HARD, "temperature": 0}, {**HARD, "temperature": 0.7}
    assert policy.decide(req(greedy)).tier is Tier.FULL
    d = policy.decide(req(sampled))
    assert d.tier is Tier.FAST and "(sampled T=0.7)" in d.reason
    assert policy.decide(req(HARD)).tier is Tier.FAST  # no temperature: vLLM samples at 1.0
    assert policy.decide(req({**HARD, "temperature": 0.3})).tier is Tier.FULL  # below 0.35
    knobs = {"sampled_from": 0.2, "default_temperature": 0.0}
    tuned = build_policy(
        "classifier", {"model": str(model_file), "sampled_model": str(inverted_file), **knobs}
    )
    assert tuned.decide(req(HARD)).tier is Tier.FULL  # a missing temperature now means greedy
    assert tuned.decide(req({**HARD, "temperature": 0.3})).tier is Tier.FAST
    # naming only `model` (a team's own) scores every request with it
    own = build_policy("classifier", {"model": str(model_file)})
    assert (
        own.decide(req(sampled)).tier is Tier.FULL
        and "sampled" not in own.decide(req(sampled)).reason
    )
    off = build_policy("classifier", {"sampled_model": None})
    assert "sampled" not in off.decide(req(sampled)).reason


def test_the_default_classifier_splits_greedy_and_sampled_requests():
    policy = build_policy("classifier", {})
    greedy = policy.decide(req({**EASY, "temperature": 0}))
    sampled = policy.decide(req(EASY))
    assert "sampled" not in greedy.reason and "(sampled T=1)" in sampled.reason
    assert greedy.threshold != sampled.threshold  # each model's own threshold


def test_budget_holds_the_fast_share(model_file: Path):
    policy = build_policy(
        "budget", {"model": str(model_file), "fast_share": 0.75, "window": 200, "min_samples": 20}
    )
    bodies = [HARD if i % 2 else EASY for i in range(400)]  # half of the traffic is hard
    tiers = [policy.decide(req(b)).tier for b in bodies]
    late = tiers[200:]
    share = late.count(Tier.FAST) / len(late)
    assert 0.45 <= share <= 0.8, share  # the hard half only partly sent to fast, by score
    # a fast share of 0.25 sends hard and some easy steps to full
    strict = build_policy(
        "budget", {"model": str(model_file), "fast_share": 0.25, "window": 200, "min_samples": 20}
    )
    tiers = [strict.decide(req(b)).tier for b in bodies][200:]
    assert tiers.count(Tier.FAST) / len(tiers) <= 0.5
    d = strict.decide(req(HARD))
    assert "fast share target 25%" in d.reason


def test_load_aware_moves_borderline_steps(model_file: Path):
    policy = build_policy("load_aware", {"model": str(model_file), "shift": 0.3})
    base = build_policy("classifier", {"model": str(model_file)})
    threshold = base.decide(req(EASY)).threshold
    busy_full = LoadSignals({Tier.FULL: 9.0, Tier.FAST: 1.0}, {})
    busy_fast = LoadSignals({Tier.FULL: 0.0, Tier.FAST: 8.0}, {})
    low_acceptance = LoadSignals({}, {Tier.FAST: 0.1})
    assert policy.decide(req(EASY)).threshold == threshold  # no load information
    up = policy.decide(req(EASY, load=busy_full))
    assert up.threshold == pytest.approx(min(1.0, threshold + 0.3))
    assert "queues full 9.0 / fast 1.0" in up.reason
    down = policy.decide(req(EASY, load=busy_fast))
    assert down.threshold == pytest.approx(max(0.0, threshold - 0.3))
    slow = policy.decide(req(EASY, load=low_acceptance))
    assert "acceptance 0.10" in slow.reason and slow.threshold < threshold + 1e-9


TOOL_LOOP = {
    "messages": [
        {"role": "user", "content": "tell me about the river please"},
        {"role": "assistant", "tool_calls": [{"id": "1", "type": "function",
                                              "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "1", "content": "ok"},
    ]
}  # fmt: skip


def test_session_escalates_after_a_fast_failure():
    policy = build_policy("session", {"base": "always_fast", "cooldown_steps": 2})
    failed = SessionState(steps=4, last_tier=Tier.FULL, fast_failures=1, last_failure_step=3)
    d = policy.decide(req(EASY, session=failed))
    assert d.tier is Tier.FULL and "failed 1 step(s) ago" in d.reason
    assert d.policy == "session/always_fast"
    second = SessionState(steps=5, last_tier=Tier.FULL, fast_failures=1, last_failure_step=3)
    assert policy.decide(req(EASY, session=second)).tier is Tier.FULL  # the 2-step cooldown
    later = SessionState(steps=6, last_tier=Tier.FULL, fast_failures=1, last_failure_step=3)
    assert policy.decide(req(EASY, session=later)).tier is Tier.FAST  # cooldown over


def test_session_keeps_a_tool_loop_on_full():
    policy = build_policy("session", {"base": "always_fast"})
    on_full = SessionState(steps=1, last_tier=Tier.FULL)
    d = policy.decide(req(TOOL_LOOP, session=on_full))
    assert d.tier is Tier.FULL and "tool loop stays" in d.reason
    # a new user turn lets the base decide; a fast loop may move up to full
    assert policy.decide(req(EASY, session=on_full)).tier is Tier.FAST
    up = build_policy("session", {"base": "always_full"})
    on_fast = SessionState(steps=1, last_tier=Tier.FAST)
    assert up.decide(req(TOOL_LOOP, session=on_fast)).tier is Tier.FULL
    off = build_policy("session", {"base": "always_fast", "sticky": False})
    assert off.decide(req(TOOL_LOOP, session=on_full)).tier is Tier.FAST


def test_session_without_history_is_the_base(model_file: Path):
    policy = build_policy(
        "session", {"base": "classifier", "base_params": {"model": str(model_file)}}
    )
    d = policy.decide(req(HARD))
    assert d.tier is Tier.FULL and d.score is not None and d.policy == "session/classifier"


def test_budget_keeps_one_window_per_scoring_model(model_file: Path, inverted_file: Path):
    params = {"model": str(model_file), "sampled_model": str(inverted_file), "fast_share": 0.5,
              "window": 100, "min_samples": 10}  # fmt: skip
    policy = build_policy("budget", params)
    for i in range(40):  # sampled traffic only
        policy.decide(req({**(HARD if i % 2 else EASY), "temperature": 1.0}))
    greedy = policy.decide(req({**EASY, "temperature": 0}))
    sampled = policy.decide(req({**EASY, "temperature": 1.0}))
    assert "over 1 steps" in greedy.reason and "over 41 steps" in sampled.reason
    models = {"model": str(model_file), "sampled_model": str(inverted_file)}
    plain = build_policy("classifier", models).decide(req({**EASY, "temperature": 0}))
    assert greedy.threshold == plain.threshold  # its window is not full yet: the model's own
