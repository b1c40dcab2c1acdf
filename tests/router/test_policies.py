from __future__ import annotations

import pytest

from router import PolicyError, RouteRequest, Tier, available_policies, build_policy
from router.features import estimate_prompt_tokens, prompt_chars


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
    policy = build_policy("length_threshold", {"threshold_tokens": 10})
    short = policy.decide(chat("x" * 39))  # 9 tokens
    long = policy.decide(chat("x" * 40))  # 10 tokens
    assert (short.tier, long.tier) == (Tier.FAST, Tier.FULL)
    assert short.reason == "length_threshold: ~9 prompt tokens < 10"
    assert long.features == {"prompt_tokens_est": 10.0}
    assert short.propensity == 1.0 and short.policy == "length_threshold"


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


def test_prompt_features_cover_every_shape():
    parts = [{"type": "text", "text": "abcd"}, {"type": "image_url", "image_url": {"url": "u"}}]
    assert (
        prompt_chars(
            {
                "messages": [
                    {"role": "user", "content": parts},
                    {"role": "assistant", "content": None},
                ]
            }
        )
        == 4
    )
    assert prompt_chars({"prompt": "abcdefgh"}) == 8
    assert prompt_chars({"prompt": ["ab", "cd"]}) == 4
    assert prompt_chars({"prompt": [1, 2, 3]}) == 12  # token ids count as one token each
    assert estimate_prompt_tokens({"messages": "not a list"}) == 0


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
