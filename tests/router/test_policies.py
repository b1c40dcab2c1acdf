from __future__ import annotations

import pytest

from router import PolicyError, RouteRequest, Tier, available_policies, build_policy
from router.tokens import Anchor, counts, estimate_prompt_tokens, position
from router.types import SessionState


def chat(text: str, **extra) -> RouteRequest:
    return RouteRequest(
        "chat", {"model": "auto", "messages": [{"role": "user", "content": text}], **extra}
    )


def test_registry_lists_builtin_policies():
    assert {"length_threshold", "always_full", "always_fast"} <= set(available_policies())


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(
        PolicyError, match=r"unknown routing policy 'magic'; known policies: .*length_threshold"
    ):
        build_policy("magic")


@pytest.mark.parametrize(
    "params", [{"threshold_tokens": -1}, {"threshold_tokens": "5"}, {"bogus": 1}]
)
def test_length_threshold_rejects_bad_params(params):
    with pytest.raises(PolicyError):
        build_policy("length_threshold", params)


def test_length_threshold_splits_at_the_threshold():
    text = "word " * 100
    tokens = estimate_prompt_tokens(chat(text).body)  # the template's share included
    short = build_policy("length_threshold", {"threshold_tokens": tokens + 1}).decide(chat(text))
    long = build_policy("length_threshold", {"threshold_tokens": tokens}).decide(chat(text))
    assert (short.tier, long.tier) == (Tier.FAST, Tier.FULL)
    assert short.reason == f"length_threshold: ~{tokens} prompt tokens < {tokens + 1}"
    assert long.features == {"prompt_tokens_est": float(tokens)}
    assert short.propensity == 1.0 and short.policy == "length_threshold"


def test_policies_size_a_session_step_from_its_last_exact_count():
    """The length threshold and the classifier's features read the same anchored count."""
    first = chat("word " * 100)
    where = position(first.body)
    assert where is not None
    counted = 4 * estimate_prompt_tokens(first.body)  # the tier counted far more
    state = SessionState(steps=1, anchor=Anchor(*where, counts(first.body), counted))
    messages = [*first.body["messages"], {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "and?"}]  # fmt: skip
    body = {"model": "auto", "messages": messages}
    tokens = counted + estimate_prompt_tokens(body) - estimate_prompt_tokens(first.body)
    request = RouteRequest("chat", body, "s", state)
    decision = build_policy("length_threshold", {"threshold_tokens": tokens}).decide(request)
    assert decision.tier is Tier.FULL  # the plain estimate is a quarter of the threshold
    assert (
        decision.reason
        == f"length_threshold: ~{tokens} prompt tokens (session-anchored) >= {tokens}"
    )
    assert request.analysis.step.features["prompt_tokens"] == tokens
    assert request.analysis.prompt_tokens == (tokens, True)
    assert decision.analysis is request.analysis
    alone = RouteRequest("chat", body, "s")  # no session history: the estimate
    assert alone.analysis.prompt_tokens == (estimate_prompt_tokens(body), False)


def test_decisions_are_deterministic():
    policy = build_policy("length_threshold")
    request = chat("hello " * 300)
    first = policy.decide(request)
    assert all(policy.decide(request) == first for _ in range(5))


def test_constant_policies():
    assert build_policy("always_full").decide(chat("x")).tier is Tier.FULL
    assert build_policy("always_fast").decide(chat("x" * 100000)).tier is Tier.FAST
    with pytest.raises(PolicyError):
        build_policy("always_full", {"x": 1})


def test_prompt_token_estimate_covers_every_shape():
    parts = [{"type": "text", "text": "abcd"}, {"type": "image_url", "image_url": {"url": "u"}}]
    with_parts = {
        "messages": [{"role": "user", "content": parts}, {"role": "assistant", "content": None}]
    }
    assert counts(with_parts).chars == 4 and counts(with_parts).messages == 2
    assert counts({"prompt": "abcdefgh"}).chars == 8
    assert counts({"prompt": ["ab", "cd"]}).chars == 4
    assert (
        estimate_prompt_tokens({"prompt": [1, 2, 3]}) == 3
    )  # token ids are counted, not estimated
    assert estimate_prompt_tokens({"prompt": [[1, 2], [3]]}) == 3
    assert estimate_prompt_tokens({"messages": "not a list"}) == 0
    assert estimate_prompt_tokens({}) == 0


def test_other_tier():
    assert Tier.FULL.other is Tier.FAST and Tier.FAST.other is Tier.FULL


def test_parts_walks_wrapped_policies_down_to_their_models():
    from router.classifier import Classifier
    from router.policy import parts

    chain = build_policy(
        "session", {"base": "rules", "base_params": {"base": "load_aware", "base_params": {}}}
    )
    kinds = [type(p).__name__ for p in parts(chain)]
    assert kinds == [
        "Session",
        "Rules",
        "LoadAware",
        "ClassifierPolicy",
        "Classifier",
        "Classifier",
    ]
    models = [p for p in parts(chain) if isinstance(p, Classifier)]
    assert [m.source.rsplit("/", 1)[-1] for m in models] == [
        "classifier.json",
        "classifier-sampled.json",
    ]
    assert list(parts(build_policy("length_threshold"))) == [build_policy("length_threshold")]
