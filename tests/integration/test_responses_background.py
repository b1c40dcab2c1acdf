"""Background responses with the official ``openai`` SDK against the gateway on a socket:
create → poll → completed, cancel while a slow tier holds the step, the refusals, tenant
isolation, and a gateway shut down mid-run (the response is stored ``failed``, saying why).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import pytest
from openai.types.responses import Response
from sqlalchemy import select

from gateway.config import Settings
from gateway.http.app import create_app
from gateway.pipeline.responses.background import SHUTDOWN
from gateway.store.database import make_engine
from gateway.store.schema import responses
from tests.integration.test_responses import AUTH, KEYS
from tests.support.fake_upstream import Behaviour, FakeUpstream
from tests.support.servers import serve_in_thread

SLOW = 4.0  # under the stack's first-byte timeout (5 s): the step is held, not retried


def wait_for(
    client: openai.OpenAI, ident: str, done: Callable[[Response], bool], timeout_s: float = 10
) -> Response:
    deadline = time.monotonic() + timeout_s
    while True:
        r = client.responses.retrieve(ident)
        if done(r):
            return r
        assert time.monotonic() < deadline, f"{ident} still {r.status}"
        time.sleep(0.02)


def test_a_background_response_is_polled_until_completed(make_stack):
    up = FakeUpstream().then(Behaviour(delay_s=0.3))
    client = make_stack([up]).client()
    r = client.responses.create(model="full", input="hi", background=True)
    assert r.status in ("queued", "in_progress") and r.background is True and r.output == []
    done = wait_for(client, r.id, lambda x: x.status == "completed")
    assert done.output_text == "hello from fake" and done.background is True
    assert done.usage is not None and done.usage.output_tokens == 4
    page = client.responses.input_items.list(r.id)
    assert [i.content[0].text for i in page.data] == ["hi"]  # type: ignore[union-attr]
    two = client.responses.create(model="full", input="and?", previous_response_id=r.id)
    assert two.status == "completed"
    assert [m["content"] for m in up.requests[-1]["messages"]] == ["hi", "hello from fake", "and?"]


def test_cancel_while_a_slow_step_holds(make_stack):
    up = FakeUpstream().then(Behaviour(delay_s=SLOW))
    client = make_stack([up]).client()
    r = client.responses.create(model="full", input="hi", background=True)
    wait_for(client, r.id, lambda x: x.status == "in_progress" and len(up.requests) == 1)
    started = time.monotonic()
    cancelled = client.responses.cancel(r.id)
    assert cancelled.status == "cancelled" and time.monotonic() - started < SLOW / 2
    assert client.responses.retrieve(r.id).status == "cancelled"
    assert client.responses.cancel(r.id).status == "cancelled"  # again: the same object
    deadline = time.monotonic() + SLOW
    while up.disconnects == 0:  # the gateway hung up on the tier
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.2)  # nothing the cancelled run does later changes what is stored
    assert client.responses.retrieve(r.id).status == "cancelled"


def test_what_cannot_be_cancelled_or_continued(make_stack):
    up = FakeUpstream().then(Behaviour(), Behaviour(), Behaviour(delay_s=SLOW))
    client = make_stack([up]).client()
    plain = client.responses.create(model="full", input="hi")
    with pytest.raises(openai.BadRequestError, match="not created with background"):
        client.responses.cancel(plain.id)
    bg = client.responses.create(model="full", input="hi", background=True)
    wait_for(client, bg.id, lambda x: x.status == "completed")
    with pytest.raises(openai.BadRequestError, match="already completed"):
        client.responses.cancel(bg.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_missing")
    running = client.responses.create(model="full", input="slow", background=True)
    with pytest.raises(openai.BadRequestError, match="still") as err:
        client.responses.create(model="full", input="x", previous_response_id=running.id)
    assert err.value.body["param"] == "previous_response_id"  # type: ignore[index]
    client.responses.cancel(running.id)


def test_another_tenants_background_response_is_not_found(make_stack):
    stack = make_stack([FakeUpstream().then(Behaviour(delay_s=SLOW))], auth=AUTH)
    a, b = stack.client(api_key=KEYS["a"]), stack.client(api_key=KEYS["b"])
    r = a.responses.create(model="full", input="hi", background=True)
    for attempt in (lambda: b.responses.retrieve(r.id), lambda: b.responses.cancel(r.id)):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert a.responses.retrieve(r.id).status in ("queued", "in_progress")
    assert a.responses.cancel(r.id).status == "cancelled"


def test_a_tenant_over_its_background_cap_gets_a_429_and_nothing_is_stored(make_stack):
    """``responses.max_background`` (per tenant and replica; tenant b's own cap is 0): the
    run over it is refused before it is stored; one ending makes room again."""
    held = Behaviour(delay_s=60)  # runs that hold their step until cancelled
    up = FakeUpstream().then(held, held, Behaviour(), held)
    caps = {"max_background": 2, "tenants": {"b": {"max_background": 0}}}
    timeouts = {"connect_s": 1, "first_byte_s": 90, "between_chunks_s": 5}
    stack = make_stack([up], auth=AUTH, responses=caps, timeouts=timeouts)
    a, b = stack.client(api_key=KEYS["a"]), stack.client(api_key=KEYS["b"])
    running = [a.responses.create(model="full", input="hi", background=True) for _ in range(2)]
    with pytest.raises(openai.RateLimitError) as err:
        a.responses.create(model="full", input="one more", background=True)
    assert err.value.body["param"] == "background"  # type: ignore[index]
    assert "responses.max_background" in err.value.message
    assert err.value.response.headers["retry-after"] == "1"
    with pytest.raises(openai.RateLimitError):
        b.responses.create(model="full", input="hi", background=True)
    for r in running:  # both runs hold their step at the tier (the script's order)
        wait_for(a, r.id, lambda x: x.status == "in_progress")
    deadline = time.monotonic() + 10
    while len(up.requests) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert a.responses.create(model="full", input="not background").status == "completed"
    engine = make_engine(stack.store_url)
    try:
        with engine.connect() as conn:
            assert len(conn.execute(select(responses.c.id)).all()) == 3  # two runs, one plain
    finally:
        engine.dispose()
    assert a.responses.cancel(running[0].id).status == "cancelled"  # room for one again
    again = a.responses.create(model="full", input="now", background=True)
    assert again.status in ("queued", "in_progress")
    for r in (running[1], again):
        assert a.responses.cancel(r.id).status == "cancelled"


def test_a_shutdown_stores_the_running_response_as_failed(tmp_path: Path):
    up = FakeUpstream().then(Behaviour(delay_s=SLOW))
    store = f"sqlite:///{tmp_path}/trajectories.db"
    with serve_in_thread(up.app) as upstream:
        settings = Settings(
            tiers={"full": {"model": "model-full", "replicas": [upstream]}},
            timeouts={"connect_s": 1, "first_byte_s": 10},
            router={"policy": "length_threshold", "calibrate_tokens": False},
            store={"url": store, "dead_letter_path": str(tmp_path / "dead-letter.jsonl")},
        )  # type: ignore[arg-type]
        with serve_in_thread(create_app(settings)) as url:
            r = httpx.post(
                url + "/v1/responses", json={"model": "full", "input": "hi", "background": True}
            )
            assert r.status_code == 200, r.text
            ident = r.json()["id"]
            deadline = time.monotonic() + 5
            while not up.requests:
                assert time.monotonic() < deadline
                time.sleep(0.02)
    engine = make_engine(store)
    try:
        with engine.connect() as conn:
            body = conn.execute(
                select(responses.c.body).where(responses.c.id == ident)
            ).scalar_one()
    finally:
        engine.dispose()
    assert body["status"] == "failed" and body["error"]["message"] == SHUTDOWN


def test_deleting_a_running_response_stops_it_and_streams_are_refused(make_stack):
    up = FakeUpstream().then(Behaviour(delay_s=SLOW))
    stack = make_stack([up])
    client = stack.client()
    r = client.responses.create(model="full", input="hi", background=True)
    got = httpx.get(stack.url + f"/v1/responses/{r.id}", params={"stream": "true"})
    assert got.status_code == 400 and got.json()["error"]["param"] == "stream"
    wait_for(client, r.id, lambda x: len(up.requests) == 1)
    client.responses.delete(r.id)
    deadline = time.monotonic() + SLOW
    while up.disconnects == 0:  # the run was stopped, not left to finish
        assert time.monotonic() < deadline
        time.sleep(0.02)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_a_streamed_background_run_goes_on_without_its_reader_and_resumes(make_stack):
    """``background`` + ``stream``: the SDK reads the run's events; a reader that leaves
    does not stop it; ``retrieve(stream=True, starting_after=N)`` resumes after N."""
    up = FakeUpstream().then(Behaviour(delay_s=0.5))
    stack = make_stack([up])
    client = stack.client()
    stream = client.responses.create(model="full", input="hi", background=True, stream=True)
    first = [next(iter(stream)) for _ in range(2)]
    stream.close()  # the reader leaves before the step's first byte
    assert [e.type for e in first] == ["response.created", "response.in_progress"]
    assert [e.sequence_number for e in first] == [0, 1]
    rid = first[0].response.id
    assert first[0].response.background is True
    done = wait_for(client, rid, lambda x: x.status not in ("queued", "in_progress"))
    assert done.status == "completed", done.error  # it ran on
    assert done.output_text == "tok0 tok1 tok2 tok3 tok4 "  # the fake tier streamed it
    rest = list(client.responses.retrieve(rid, stream=True, starting_after=1))
    assert [e.sequence_number for e in rest] == list(range(2, 2 + len(rest)))
    assert rest[-1].type == "response.completed"
    text = "".join(e.delta for e in rest if e.type == "response.output_text.delta")
    assert text == done.output_text and rest[-1].response.output_text == done.output_text
    # the whole stream, read again
    whole = httpx.get(stack.url + f"/v1/responses/{rid}", params={"stream": "true"})
    assert whole.text.count("event: ") == 2 + len(rest)


def test_a_streamed_background_run_cancelled_ends_its_stream(make_stack):
    up = FakeUpstream().then(Behaviour(delay_s=SLOW))
    client = make_stack([up]).client()
    stream = client.responses.create(model="full", input="hi", background=True, stream=True)
    events = iter(stream)
    created = next(events)
    wait_for(client, created.response.id, lambda x: len(up.requests) == 1)
    assert client.responses.cancel(created.response.id).status == "cancelled"
    assert [e.type for e in events] == ["response.in_progress"]  # then the stream ends
