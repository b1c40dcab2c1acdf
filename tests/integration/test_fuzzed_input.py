"""Seeded mutations of valid requests to every endpoint: whatever is changed, the gateway
answers in the OpenAI error shape with a 4xx (or serves the request), never a 5xx, keeps
serving, records every step it answered (and exports it), and its router never fails on
them. The mutations are the kinds of damage clients really do: wrong types, nulls, empty
and huge values, lone surrogates, big and non-finite numbers, unknown or missing keys."""

from __future__ import annotations

import copy
import json
import random
from typing import Any

import httpx
import orjson
import pyarrow.parquet as pq

from gateway.config import Settings
from gateway.export.formats import FORMATS, export
from gateway.export.load import Filter
from gateway.store.database import make_engine
from gateway.store.rewards import DEFAULT_WEIGHTS
from sandbox.config import SandboxConfig
from sandbox.service import create_app
from tests.sandbox.conftest import EVERYTHING
from tests.support.fake_upstream import FakeUpstream
from tests.support.servers import free_port, serve_in_thread

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CHAT = {
    "model": "auto",
    "messages": [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "weather in Paris?"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ],
    "tools": [TOOL],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
    "max_tokens": 16, "temperature": 0.5, "top_p": 0.9, "n": 1, "stop": ["\n"], "seed": 3,
    "stream": False, "stream_options": {"include_usage": True}, "logprobs": True, "top_logprobs": 2,
    "user": "u1", "reasoning_effort": "low", "metadata": {"k": "v"},
}  # fmt: skip
COMPLETION = {
    "model": "full",
    "prompt": ["a", "b"],
    "max_tokens": 8,
    "echo": False,
    "stream": False,
}
REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    (
        "POST",
        "/v1/sessions",
        {
            "id": "s1",
            "task_id": "t",
            "group_id": "g",
            "expected_actions": [{"name": "get_weather", "arguments": {"city": "Paris"}}],
        },
    ),
    ("POST", "/v1/chat/completions", CHAT),
    # not forced: a forced tool call goes to full by rule, this one reaches the classifier
    ("POST", "/v1/chat/completions", {**CHAT, "tool_choice": "auto"}),
    ("POST", "/v1/completions", COMPLETION),
    ("POST", "/v1/feedback", {"session_id": "s1", "score": 1.0, "label": "good", "comment": "ok"}),
    ("POST", "/v1/tools/read_file", {"arguments": {"path": "a.txt"}, "tool_call_id": "c1"}),
    ("POST", "/v1/tools/write_file", {"arguments": {"path": "d/a.txt", "content": "x"}}),
    ("POST", "/v1/tools/run_python", {"arguments": {"code": "print(6 * 7)"}, "tool_call_id": "c1"}),
    ("POST", "/v1/tools/list_dir", {"arguments": {"path": "."}}),
    ("POST", "/v1/sessions/s1/end", {"outcome": "success", "reward": 1.0}),
]
ODD_VALUES: list[Any] = [
    None, True, False, 0, -1, 2**63, 10**40, 1e308, -1e-308, "", "x" * 5000, "\ud800",
    "\u0000", "💥", [], [None], {}, {"": None}, [[[[]]]], {"type": None}, "NaN", 3.5,
]  # fmt: skip
ODD_LITERALS = [b"NaN", b"Infinity", b"-Infinity", b"1e999", b'"\\ud800\\udc00\\ud800"']


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            found += paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += paths(v, (*prefix, i))
    return found


def mutate(body: dict[str, Any], rng: random.Random) -> bytes:
    body = copy.deepcopy(body)
    for _ in range(rng.choice((1, 1, 2, 3))):
        where = rng.choice(paths(body))
        parent = body
        for key in where[:-1]:
            parent = parent[key]
        last = where[-1]
        action = rng.random()
        if action < 0.15 and isinstance(parent, dict):
            del parent[last]
            if not paths(body):
                break
        elif action < 0.25 and isinstance(parent, dict):
            parent[f"unknown_{rng.randrange(9)}"] = copy.deepcopy(rng.choice(ODD_VALUES))
        else:
            parent[last] = copy.deepcopy(rng.choice(ODD_VALUES))
    raw = json.dumps(body, allow_nan=True).encode()
    if rng.random() < 0.1:  # a literal JSON parsers disagree on, in place of one value
        value = json.dumps(rng.choice(ODD_VALUES[3:8])).encode()
        raw = raw.replace(value, rng.choice(ODD_LITERALS), 1)
    return raw


def test_mutated_requests_get_4xx_or_an_answer_never_a_5xx(make_stack, sandbox_root, tmp_path):
    port = free_port()
    sandbox_cfg = SandboxConfig(token="t", root=sandbox_root, host="127.0.0.1", port=port,
                                grants_by_tenant={"default": EVERYTHING})  # fmt: skip
    rng = random.Random(20261130)
    failures: list[str] = []
    served: list[str] = []  # step ids of the mutated requests that were answered
    routed_by_model = 0
    with serve_in_thread(create_app(sandbox_cfg), port=port):
        # the default router chain, not the tests' predictable one: it reads every request
        stack = make_stack([FakeUpstream()], [FakeUpstream("fast")],
                           sandbox={"token": "t", "host": "127.0.0.1", "port": port},
                           router=Settings().router.model_dump())  # fmt: skip
        with httpx.Client(base_url=stack.url, timeout=30) as client:
            headers = {"x-session-id": "s1", "content-type": "application/json"}
            for method, path, body in REQUESTS:  # valid first: they must be served
                r = client.request(method, path, content=json.dumps(body), headers=headers)
                assert r.status_code < 300, (path, r.text)
            for i in range(900):
                method, path, body = REQUESTS[i % len(REQUESTS)]
                raw = mutate(body, rng)
                r = client.request(method, path, content=raw, headers=headers)
                reason = r.headers.get("x-gearshift-route-reason", "")
                routed_by_model += reason.startswith("classifier")
                if "policy error" in reason:  # routed to full after the router raised
                    failures.append(f"{path} {reason[:300]} <- {raw[:400]!r}")
                if r.status_code == 200 and "x-gearshift-step-id" in r.headers:
                    served.append(r.headers["x-gearshift-step-id"])
                if r.status_code >= 500:
                    failures.append(f"{path} {r.status_code} {r.text[:300]} <- {raw[:400]!r}")
                elif r.status_code >= 400:
                    error = r.json().get("error")
                    if not (isinstance(error, dict) and set(error) == {"message", "type", "param", "code"}
                            and error["message"]):  # fmt: skip
                        failures.append(
                            f"{path} {r.status_code} not the error shape: {r.text[:300]}"
                        )
            assert client.post("/v1/chat/completions", json={"model": "full", "messages": [
                {"role": "user", "content": "still there?"}]}).status_code == 200  # fmt: skip
            # the damaged requests around them lost none of the answered steps
            lost = [i for i in served if client.get(f"/v1/steps/{i}").status_code != 200]
    assert len(served) > 20, "too few mutated requests were answered to check recording"
    assert routed_by_model > 10, "too few mutated requests reached the router's classifier"
    assert not lost, f"{len(lost)} of {len(served)} answered steps were not recorded"
    assert not failures, "\n".join(failures[:20])
    # and they all leave the store in every export format
    engine = make_engine(stack.store_url)
    for fmt, spec in FORMATS.items():
        out = tmp_path / f"export-{fmt}"
        export(engine, fmt, out, Filter(), DEFAULT_WEIGHTS, progress=False)
        if spec.container == "parquet":
            rows = pq.read_table(out).num_rows
        else:
            rows = len(out.read_bytes().splitlines())
        assert rows > 0, fmt
        if fmt == "trl-sft":  # every answered step is in some exported conversation
            exported = {
                step["id"]
                for line in out.read_bytes().splitlines()
                for step in orjson.loads(line)["gearshift"]["steps"]
            }
            assert set(served) <= exported, set(served) - exported


def test_odd_ids_and_headers_get_4xx_or_an_answer(make_stack):
    stack = make_stack([FakeUpstream()], [FakeUpstream("fast")])
    bad = []
    idents = [
        "%00",
        "x" * 300,
        "..%2F..%2Fetc",
        "%F0%9F%92%A5",
        "a%2Fb",
        "%20",
        "%25",
        "-1",
        "1e999",
    ]
    headers = [{"x-session-id": "x" * 9000}, {"x-session-id": ""}, {"x-session-id": "%C3%A9"},
               {"authorization": "Bearer " + "x" * 9000}, {"content-type": "text/plain"},
               {"content-encoding": "gzip"}, {"x-request-id": "x" * 500}, {"user-agent": ""}]  # fmt: skip
    body = json.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        responses = [
            client.get(f"/v1/{kind}/{ident}") for ident in idents for kind in ("steps", "sessions")
        ]
        responses += [client.post(f"/v1/sessions/{ident}/end", json={}) for ident in idents]
        responses += [client.post("/v1/chat/completions", headers=h, content=body) for h in headers]
    for r in responses:
        if r.status_code >= 500 or (
            r.status_code >= 400
            and set(r.json().get("error", {})) != {"message", "type", "param", "code"}
        ):
            bad.append(
                (
                    str(r.request.url)[:120],
                    dict(r.request.headers).get("x-session-id", "")[:20],
                    r.status_code,
                    r.text[:200],
                )
            )
    assert not bad, bad
    assert (
        sum(r.status_code == 200 for r in responses[-len(headers) :]) >= 5
    )  # odd but valid: served
