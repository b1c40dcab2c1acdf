"""Analysis: what the router derives from a request, computed once and carried back."""

from __future__ import annotations

from dataclasses import replace
from typing import get_args

import pytest

import router.analysis
from router import (
    Analysis,
    Decision,
    Endpoint,
    RouteRequest,
    Tier,
    available_policies,
    build_policy,
)
from router.risk import RISKS, Risk
from router.step_features import analyse
from router.tokens import DEFAULT, Anchor, anchored, counts, position
from router.types import SessionState

CHAT = {
    "model": "auto",
    "messages": [
        {"role": "user", "content": "Compute 48213 * 99121 and then tell me about rivers."},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "```py\nprint(1)\n```"},
    ],
}


def test_each_part_is_what_the_functions_compute():
    a = RouteRequest("chat", CHAT).analysis
    assert a.counts == counts(CHAT)
    assert a.prompt_tokens == (DEFAULT.estimate(CHAT), False)
    assert a.step == analyse(CHAT)
    assert a.position == position(CHAT) and a.position is not None
    completions = RouteRequest("completions", {"prompt": "x"}).analysis
    assert completions.position is None and completions.prompt_tokens[1] is False


def test_each_part_is_computed_once(monkeypatch: pytest.MonkeyPatch):
    calls: dict[str, int] = {}

    def counting(name: str):
        real = getattr(router.analysis, name)

        def wrapper(*args, **kwargs):
            calls[name] = calls.get(name, 0) + 1
            return real(*args, **kwargs)

        return wrapper

    for name in ("counts", "anchored", "analyse", "position"):
        monkeypatch.setattr(router.analysis, name, counting(name))
    request = RouteRequest("chat", CHAT, "s")
    assert calls == {}  # nothing until a policy reads it
    # a chain whose three policies all size the prompt or read the step's features
    chain = build_policy("session", {"base": "rules", "base_params": {"code": False}})
    decision = chain.decide(request)
    assert decision.analysis is request.analysis
    for _ in range(3):
        a = decision.analysis
        assert a.counts is a.counts and a.step is a.step and a.prompt_tokens is a.prompt_tokens
        assert a.position is a.position
    assert request.analysis.counts is decision.analysis.counts
    assert request.analysis.prompt_tokens is decision.analysis.prompt_tokens
    assert calls == {"counts": 1, "anchored": 1, "analyse": 1, "position": 1}


def test_the_session_anchor_and_token_model_size_the_prompt():
    where = position(CHAT)
    assert where is not None
    longer = {**CHAT, "messages": [*CHAT["messages"], {"role": "assistant", "content": "done"}]}
    state = SessionState(steps=1, anchor=Anchor(*where, counts(CHAT), 1000))
    a = RouteRequest("chat", longer, "s", state).analysis
    assert a.prompt_tokens == anchored(DEFAULT, counts(longer), longer, state.anchor)
    assert a.prompt_tokens[1] is True and a.step.features["prompt_tokens"] == a.prompt_tokens[0]
    model = replace(DEFAULT, base=DEFAULT.base + 100, source="test")
    alone = RouteRequest("chat", CHAT, tokens=model).analysis
    assert alone.prompt_tokens == (model.estimate(CHAT), False)


@pytest.mark.parametrize("name", available_policies())
def test_every_registered_policy_carries_the_analysis_back(name: str):
    request = RouteRequest("chat", CHAT, "s", SessionState(steps=2, last_tier=Tier.FULL))
    decision = build_policy(name).decide(request)
    assert decision.analysis is request.analysis


def test_a_request_is_built_positionally_and_replace_analyses_afresh():
    request = RouteRequest("chat", CHAT, "s", None, None, tokens=None)
    assert isinstance(request.analysis, Analysis)
    other = replace(request, body={"prompt": "x"})
    assert other.analysis is not request.analysis and other.analysis.position is None
    assert request == RouteRequest("chat", CHAT, "s")  # the analysis is not compared
    assert "analysis" not in repr(request)
    with pytest.raises(TypeError):
        RouteRequest("chat", CHAT, analysis=request.analysis)  # type: ignore[call-arg]


def test_a_decision_is_built_positionally_and_compared_without_its_analysis():
    d = Decision(Tier.FULL, "why", "p", 0.5, {"f": 1.0}, 0.7, 0.4)
    assert d.analysis is None and d.threshold == 0.4
    analysed = replace(d, analysis=RouteRequest("chat", CHAT).analysis)
    assert analysed == d and "analysis" not in repr(analysed)


def test_closed_sets_are_literal_types():
    assert get_args(Endpoint) == ("chat", "completions")
    assert get_args(Risk) == RISKS
