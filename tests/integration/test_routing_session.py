"""Session-aware routing through the gateway: a fast-tier failure sends the rest of the
session to full, sessions are told apart by header or by their opening, and the trained
classifier's score and threshold are recorded with every step."""

from __future__ import annotations

import httpx
import orjson

from tests.support.fake_upstream import Behaviour, FakeUpstream
from tests.support.tools import WEATHER_TOOLS


def bad_call() -> Behaviour:
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"town": 3}'}}  # fmt: skip
    return Behaviour(message={"role": "assistant", "content": None, "tool_calls": [call]})


def post(stack, content: str, session: str | None = None, **extra) -> httpx.Response:
    body = {"model": "auto", "messages": [{"role": "user", "content": content}], **extra}
    headers = {"x-session-id": session} if session else {}
    return httpx.post(stack.url + "/v1/chat/completions", json=body, headers=headers)


SESSION = {"policy": "session", "params": {"base": "always_fast", "cooldown_steps": 2}}


def test_a_failure_on_fast_sends_the_session_to_full(make_stack):
    fast = FakeUpstream("fast").then(bad_call())
    full = FakeUpstream("full")
    stack = make_stack([full], [fast], router=SESSION)
    first = post(stack, "weather?", "s1", tools=WEATHER_TOOLS)
    assert "escalated to full" in first.headers["x-gearshift-route-reason"]
    second = post(stack, "and tomorrow?", "s1")
    assert second.headers["x-gearshift-tier"] == "full"
    reason = second.headers["x-gearshift-route-reason"]
    assert reason.startswith("session: a fast-tier step failed 1 step(s) ago")
    assert post(stack, "hello", "s2").headers["x-gearshift-tier"] == "fast"  # other session
    post(stack, "more", "s1")  # the second step of the cooldown
    assert post(stack, "and now?", "s1").headers["x-gearshift-tier"] == "fast"  # cooldown over


def test_sessions_without_an_id_are_known_by_their_opening(make_stack):
    fast = FakeUpstream("fast").then(bad_call())
    stack = make_stack([FakeUpstream("full")], [fast], router=SESSION)
    opening = [{"role": "system", "content": "You are an agent."},
               {"role": "user", "content": "Plan my trip."}]  # fmt: skip
    body = {"model": "auto", "messages": opening, "tools": WEATHER_TOOLS}
    httpx.post(stack.url + "/v1/chat/completions", json=body)  # escalated
    later = {**body, "messages": [*opening, {"role": "assistant", "content": "ok"},
                                  {"role": "user", "content": "go on"}]}  # fmt: skip
    r = httpx.post(stack.url + "/v1/chat/completions", json=later)
    assert r.headers["x-gearshift-tier"] == "full"
    other = {**body, "messages": [{"role": "user", "content": "Something else."}]}
    assert (
        httpx.post(stack.url + "/v1/chat/completions", json=other).headers["x-gearshift-tier"]
        == "fast"
    )


def test_classifier_decisions_are_explained_and_recorded(make_stack):
    stack = make_stack([FakeUpstream("full")], [FakeUpstream("fast")],
                       router={"policy": "session", "params": {"base": "classifier"}})  # fmt: skip
    r = post(stack, "Complete this Python function.\n```python\ndef add(a, b):\n```", "c1")
    assert r.status_code == 200, r.text
    reason = r.headers["x-gearshift-route-reason"]
    assert reason.startswith("classifier: p(full)=") and "top: " in reason
    step = httpx.get(stack.url + "/v1/steps/" + r.headers["x-gearshift-step-id"]).json()
    assert step["policy"] == "session/classifier"
    features = step["features"]
    assert 0.0 <= features["route_score"] <= 1.0 and "route_threshold" in features
    assert features["code"] == 1.0
    assert stack.metric("gearshift_route_decision_seconds_count") >= 1
    # no temperature: vLLM will sample at 1.0, so the sampled-outcome model decides
    assert "(sampled T=1)" in reason
    greedy = post(stack, "Hi.", temperature=0)
    assert "sampled" not in greedy.headers["x-gearshift-route-reason"]
    greedy_step = httpx.get(stack.url + "/v1/steps/" + greedy.headers["x-gearshift-step-id"]).json()
    assert greedy_step["features"]["route_threshold"] != features["route_threshold"]


class Boom:
    name = "boom"

    def decide(self, request):
        raise RuntimeError("bug in a policy")


def test_a_failing_policy_sends_the_request_to_full_not_to_an_error(make_stack):
    from router.policy import _REGISTRY, register

    register("boom")(lambda params: Boom())
    try:  # a policy of this test's own: gone again after it
        stack = make_stack(
            [FakeUpstream("full")], [FakeUpstream("fast")], router={"policy": "boom"}
        )
        r = post(stack, "hello")
    finally:
        _REGISTRY.pop("boom", None)
    assert r.status_code == 200
    assert r.headers["x-gearshift-tier"] == "full"
    assert r.headers["x-gearshift-route-reason"] == "policy error (RuntimeError): full tier"


def test_a_session_step_is_sized_from_what_the_tier_counted_for_the_last(make_stack):
    """The stand-in tiers count 7 prompt tokens whatever they are sent: a long opening
    step goes to full by its estimate, and the session's next step is sized from those 7
    (plus the estimate of what was added) rather than from the estimate of everything."""
    stack = make_stack([FakeUpstream("full")], [FakeUpstream("fast")])  # length threshold 512
    opening = [{"role": "user", "content": "word " * 600}]
    first = httpx.post(
        stack.url + "/v1/chat/completions",
        json={"model": "auto", "messages": opening},
        headers={"x-session-id": "long"},
    )
    assert first.headers["x-gearshift-tier"] == "full"
    assert "(session-anchored)" not in first.headers["x-gearshift-route-reason"]
    later = [*opening, first.json()["choices"][0]["message"], {"role": "user", "content": "more"}]
    second = httpx.post(
        stack.url + "/v1/chat/completions",
        json={"model": "auto", "messages": later},
        headers={"x-session-id": "long"},
    )
    reason = second.headers["x-gearshift-route-reason"]
    assert second.headers["x-gearshift-tier"] == "fast", reason
    assert reason.startswith("length_threshold: ~") and "(session-anchored) < 512" in reason
    assert int(reason.split("~")[1].split()[0]) < 100  # 7 + the answer and "more"
    # another session with the same history but no count of its own: the estimate
    other = httpx.post(
        stack.url + "/v1/chat/completions",
        json={"model": "auto", "messages": later},
        headers={"x-session-id": "other"},
    )
    assert other.headers["x-gearshift-tier"] == "full"
    metrics = httpx.get(stack.url + "/metrics").text
    assert "gearshift_route_prompt_tokens_anchored_error_count 1.0" in metrics


def test_rollouts_that_share_an_opening_keep_their_own_history(make_stack):
    """Two samples of one task, no session id: each continues its own answer (hash chain),
    so the escalation in one sends only that one to full; the other stays on fast."""
    fast = FakeUpstream("fast").then(
        Behaviour(message={"role": "assistant", "content": "Plan A: read the file."}),
        Behaviour(message={"role": "assistant", "content": "Plan B: run the tests."}),
        bad_call(),  # rollout A's second step
    )
    stack = make_stack([FakeUpstream("full")], [fast], router=SESSION)
    opening = [{"role": "system", "content": "You are an agent."},
               {"role": "user", "content": "Fix the failing test."}]  # fmt: skip

    def chat(messages: list[dict]) -> httpx.Response:
        body = {"model": "auto", "messages": messages, "tools": WEATHER_TOOLS}
        return httpx.post(stack.url + "/v1/chat/completions", json=body)

    answers = [chat(opening).json()["choices"][0]["message"] for _ in range(2)]
    assert [a["content"][:6] for a in answers] == ["Plan A", "Plan B"]
    go = {"role": "user", "content": "go on"}
    rollout_a, rollout_b = ([*opening, a, go] for a in answers)
    escalated = chat(rollout_a)
    assert "escalated to full" in escalated.headers["x-gearshift-route-reason"]
    rollout_a += [escalated.json()["choices"][0]["message"], go]
    after = chat(rollout_a)
    assert after.headers["x-gearshift-tier"] == "full"  # A's own failure: cooldown
    assert after.headers["x-gearshift-route-reason"].startswith("session: a fast-tier step failed")
    other = chat(rollout_b)
    assert other.headers["x-gearshift-tier"] == "fast", other.headers["x-gearshift-route-reason"]


def test_streamed_answers_chain_with_recording_off(make_stack):
    """The gateway assembles a streamed answer itself when no recorder does, so an unnamed
    session's next step still finds its own history."""
    fast = FakeUpstream("fast").then(Behaviour(events=3), Behaviour(events=4), bad_call())
    stack = make_stack([FakeUpstream("full")], [fast], router=SESSION, store={"enabled": False})
    opening = [{"role": "user", "content": "Fix the failing test."}]

    def streamed(messages: list[dict]) -> str:
        body = {"model": "auto", "messages": messages, "stream": True}
        with httpx.stream("POST", stack.url + "/v1/chat/completions", json=body) as r:
            events = [line[6:] for line in r.iter_lines() if line.startswith("data: {")]
        return "".join(
            (orjson.loads(e)["choices"] or [{}])[0].get("delta", {}).get("content") or ""
            for e in events
        )

    def chat(messages: list[dict]) -> httpx.Response:
        body = {"model": "auto", "messages": messages, "tools": WEATHER_TOOLS}
        return httpx.post(stack.url + "/v1/chat/completions", json=body)

    answers = [streamed(opening), streamed(opening)]
    assert answers == ["tok0 tok1 tok2 ", "tok0 tok1 tok2 tok3 "]
    go = {"role": "user", "content": "go on"}
    rollout_a, rollout_b = ([*opening, {"role": "assistant", "content": a}, go] for a in answers)
    assert "escalated to full" in chat(rollout_a).headers["x-gearshift-route-reason"]
    other = chat(rollout_b)
    assert other.headers["x-gearshift-tier"] == "fast", other.headers["x-gearshift-route-reason"]
