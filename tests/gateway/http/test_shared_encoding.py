"""One serialization of a named session's history, shared by its validation and the
upstream payload (``SessionValidator.validate`` → ``ParsedRequest.encoded`` →
``UpstreamRequest.payload``). Over a few hundred random session steps (histories edited,
keys reordered, values retyped, invalid messages, duplicate keys, unicode escapes, huge
numbers, NaN, deep nesting), each step gets what it got before: the same 4xx as a whole
validation, and upstream payloads byte for byte those of ``orjson.dumps`` of the whole
body."""

from __future__ import annotations

import asyncio
import copy
import json
import random
from typing import Any

import orjson
from starlette.requests import Request

from bench.agent_body import session_bodies
from gateway.errors import GatewayError
from gateway.http.body import checked, read_json_raw
from gateway.http.protocol import REQUESTS
from gateway.http.session_validation import SessionValidator
from gateway.pipeline.request import ParsedRequest, RequestIdentity
from gateway.pipeline.upstream_body import build_upstream_request

CHAT = REQUESTS["chat"]

WHO = RequestIdentity("req-1", 0.0, "chat", "auto", "tenant", "key", "s")
MODELS = ("model-full", "model-fast")


def read(raw: bytes) -> tuple[bytes, dict[str, Any]]:
    """The body as ``gateway.http.completions`` reads it."""

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": raw, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/", "headers": []}
    return asyncio.run(read_json_raw(Request(scope, receive), 1 << 24))


def payloads(up: Any, written: bool) -> tuple[object, ...]:
    """Each tier's payload: the pipeline's (``written``), or the whole body dumped."""
    out: list[object] = []
    for model in MODELS:
        try:
            if written:
                out.append(up.payload(model))
            else:
                out.append(orjson.dumps({**up.body, "model": model}))
        except orjson.JSONEncodeError as exc:  # too deep to write: dispatch fails alike
            out.append(("JSONEncodeError", str(exc)))
    return tuple(out)


def before(raw: bytes) -> tuple[object, ...]:
    """What the step got before: whole validation, the whole body dumped per tier."""
    try:
        raw, body = read(raw)
        checked(body, CHAT)
    except GatewayError as exc:
        return ("refused", exc.status, exc.message, getattr(exc, "param", None))
    parsed = ParsedRequest(WHO, body, raw)
    return tuple(
        payloads(build_upstream_request(parsed, capture=capture), written=False)
        for capture in (False, True)
    )


def now(validator: SessionValidator, raw: bytes, session: tuple[str, str]) -> tuple[object, ...]:
    try:
        raw, body = read(raw)
        encoded = validator.validate(body, CHAT, session, len(raw))
    except GatewayError as exc:
        return ("refused", exc.status, exc.message, getattr(exc, "param", None))
    parsed = ParsedRequest(WHO, body, raw, encoded)
    return tuple(
        payloads(build_upstream_request(parsed, capture=capture), written=True)
        for capture in (False, True)
    )


def mutate(body: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """An agent's step, sometimes changed as clients do, or as a hostile one would."""
    body = {**copy.deepcopy(body), "model": "auto"}  # as bench.loadgen sends it
    messages = body["messages"]
    history = messages[:-1] or messages
    r = rng.random
    if r() < 0.1:  # a client that writes a message's keys in another order
        i = rng.randrange(len(history))
        history[i] = dict(reversed(list(history[i].items())))
    if r() < 0.1:  # history edited
        m = rng.choice(history)
        m["content"] = (m.get("content") or "") + " (edited)"
    if r() < 0.08:  # equal by ``==``, not the same JSON: 1, 1.0 and true in an extra field
        rng.choice(history)["x_meta"] = rng.choice(
            [1, 1.0, True, {"a": 1, "b": 2}, {"b": 2, "a": 1}]
        )
    if r() < 0.05:
        messages[-1]["content"] = 7  # an invalid new message
    if r() < 0.04:
        rng.choice(history)["content"] = 7  # an invalid old one
    if r() < 0.05 and body.get("tools"):  # strict mode: 1 is not a bool, though 1 == True
        body["tools"][0]["function"]["strict"] = rng.choice([True, 1])
    if r() < 0.04:
        body.pop("tools", None)
    if r() < 0.03:
        body["tools"] = None
    if r() < 0.08:
        body["brand_new_param"] = [1, 1.0, True, None, "é"]
    if r() < 0.1:
        body["stream"] = True
        if r() < 0.5:
            body["stream_options"] = {"include_usage": r() < 0.5, "continuous_usage_stats": True}
    if r() < 0.03:
        body["messages"] = []
    return body


def hostile(raw: bytes, rng: random.Random) -> bytes:
    """What only the bytes can say."""
    r = rng.random
    if r() < 0.05:  # duplicate keys: the last one counts
        raw = b'{"messages":[{"role":"user","content":"shadowed"}],' + raw[1:]
    if r() < 0.04:
        raw = raw[:-1] + b',"messages":[{"role":"user","content":"last wins"}]}'
    if r() < 0.08:  # unicode escapes, the same text
        raw = raw.replace(b'"role":"user"', b'"role":"\\u0075ser"').replace(b"You", b"\\u0059ou")
    if r() < 0.05:  # another client's spacing
        raw = json.dumps(orjson.loads(raw)).encode()
    if r() < 0.04:  # past 64 bits: a float, which ``seed`` (an int) refuses
        raw = raw[:-1] + b',"seed":18446744073709551616}'
    if r() < 0.04:  # valid (an extra field), deeper than orjson writes
        deep = b'"x_deep":' + b"[" * 300 + b"1" + b"]" * 300 + b',"role":"system"'
        raw = raw.replace(b'"role":"system"', deep, 1)
    if r() < 0.03:
        raw = raw[:-1] + b',"temperature":NaN}'
    if r() < 0.03:
        raw = raw[:-1] + b',"temperature":1e400}'
    if r() < 0.02:
        raw = raw[:-1] + b',"x_deeper":' + b"[" * 2000 + b"]" * 2000 + b"}"
    return raw


def test_random_session_steps_get_what_they_got_before():
    rng = random.Random(29)
    validator = SessionValidator()
    kinds: set[str] = set()
    steps = 0
    for seed in range(20):
        session = ("tenant", f"s{seed}")
        for body in session_bodies(seed):
            for _ in range(2 if rng.random() < 0.1 else 1):  # sometimes sent again
                raw = hostile(orjson.dumps(mutate(body, rng)), rng)
                expected = before(raw)
                assert now(validator, raw, session) == expected, (seed, raw[:200])
                kinds.add(str(expected[0]) if expected[0] == "refused" else "ok")
                steps += 1
    assert steps >= 300 and kinds == {"ok", "refused"}
    assert validator.skipped > 1000  # the shared prefix was taken, not only whole validations


def test_a_value_equal_by_eq_but_not_the_same_json_is_validated_again():
    """``True == 1``, but strict validation refuses 1 for a bool: the history is compared
    as written, so the request gets whole validation's 400."""
    validator = SessionValidator()
    first, second = ({**copy.deepcopy(b), "model": "auto"} for b in session_bodies(0)[:2])
    first["tools"][0]["function"]["strict"] = True
    second["tools"][0]["function"]["strict"] = 1
    validator.validate(first, CHAT, ("t", "s"), 1000)
    expected = before(orjson.dumps(second))
    assert expected[0] == "refused"
    assert now(validator, orjson.dumps(second), ("t", "s")) == expected
