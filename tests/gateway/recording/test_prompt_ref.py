"""Prompt ids by reference: whatever a session does, every reader gets the exact prompt back.

The writer stores a step's prompt as a reference to the session's previous step plus its
new ids (``gateway.recording.prompt_ref``); the API, the exports and the downgrade rebuild
it (``gateway.store.prompt_refs``). These tests generate tool-loop sessions with the things
that break a plain prefix (context condensation, a second sample continued instead of the
first, retries that resend a prompt, a re-tokenized boundary, steps without ids, other
sessions interleaved, restarts and rolled-back batches of the writer) and compare every
prompt read back with the one the engine returned.
"""

from __future__ import annotations

import random
import struct
import time
import uuid
from pathlib import Path
from typing import Any

import orjson
import pytest
from sqlalchemy import Engine, func, select

from gateway.export.load import Filter, trajectories
from gateway.recording.prompt_ref import MIN_SHARED, Encoded, Last, Template, encode
from gateway.recording.records import ChoiceCapture, RawJson, StepRecord
from gateway.recording.writer import StepWriter
from gateway.store import queries
from gateway.store.database import downgrade, make_engine, upgrade
from gateway.store.schema import steps


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(0, 151_000) for _ in range(n)]


def as_sent(rng: random.Random, prompt: list[int]) -> RawJson | list[int]:
    """The prompt as the writer may get it: vLLM's bytes (compact, sometimes spaced) or a
    list (a record read back from the dead-letter file)."""
    kind = rng.random()
    if kind < 0.1:
        return list(prompt)
    if kind < 0.2:
        return RawJson(("[" + ", ".join(map(str, prompt)) + "]").encode())
    return RawJson(orjson.dumps(prompt))


def record(
    session: str, prompt: Any, completions: list[list[int]], status: int = 200
) -> StepRecord:
    return StepRecord(
        step_ids=[uuid.uuid4().hex for _ in completions], request_id=uuid.uuid4().hex,
        tenant="acme", api_key="k", endpoint="chat",
        request={"model": "auto", "messages": [{"role": "user", "content": "go"}]},
        external_session=session, task_id=None, group_id=None, created_at=time.time(),
        status=status, tier="fast", prompt_token_ids=prompt,
        choices=[ChoiceCapture(i, {"role": "assistant", "content": "x"}, c, [-0.5] * len(c),
                               "tool_calls") for i, c in enumerate(completions)],
    )  # fmt: skip


def session(
    rng: random.Random,
    name: str,
    steps_n: int,
    opening: list[int] = (),  # type: ignore[assignment]
) -> list[tuple[StepRecord, list[int] | None]]:
    """(record, the prompt it carries) for one agent session; its history begins with some
    of ``opening`` (one agent's system prompt and tools, shared by its sessions)."""
    out: list[tuple[StepRecord, list[int] | None]] = []
    history = list(opening[: rng.randrange(0, len(opening) + 1)]) + ids(rng, rng.randrange(1, 400))
    earlier: list[list[int]] = []
    for _ in range(steps_n):
        prompt = history + ids(rng, rng.randrange(0, 300))
        move = rng.random()
        if move < 0.08 and out:  # a failed step: no ids captured
            out.append((record(name, None, [[]], status=502), None))
            continue
        if move < 0.16 and earlier:  # a retry or a branch: resend an earlier prompt
            prompt = list(rng.choice(earlier))
        n = 2 if rng.random() < 0.15 else 1
        completions = [ids(rng, rng.randrange(1, 120)) for _ in range(n)]
        out.append((record(name, as_sent(rng, prompt), completions), prompt))
        earlier.append(prompt)
        chosen = rng.choice(completions)
        after = rng.random()
        if after < 0.1:  # condensed: the system prompt kept, the rest summarized
            history = prompt[: rng.randrange(0, 200)] + ids(rng, 150)
        elif after < 0.25:  # the template re-tokenizes the answer's last tokens
            history = prompt + chosen[: max(0, len(chosen) - 2)] + ids(rng, 3)
        else:
            history = prompt + chosen
    return out


def write(engine: Engine, rng: random.Random, records: list[StepRecord]) -> None:
    writer = StepWriter()
    at = 0
    while at < len(records):
        size = rng.randrange(1, 12)
        with engine.begin() as conn:
            writer.write(conn, records[at : at + size])
        at += size
        luck = rng.random()
        if luck < 0.1:
            writer = StepWriter()  # the writer process restarted
        elif luck < 0.2:
            writer.forget_caches()  # after a rolled-back batch


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    url = f"sqlite:///{tmp_path}/t.db"
    upgrade(url)
    return make_engine(url)


@pytest.mark.parametrize("seed", range(12))
def test_every_reader_gets_back_the_prompt_the_engine_returned(engine, seed):
    rng = random.Random(seed)
    opening = ids(rng, 500)  # the first prompts of sessions share ids (``Template``)
    sessions = [session(rng, f"s{k}", rng.randrange(5, 25), opening) for k in range(3)]
    # the sessions' steps interleave as concurrent agents' do
    merged = []
    while any(sessions):
        merged.append(rng.choice([s for s in sessions if s]).pop(0))
    write(engine, rng, [r for r, _ in merged])
    want = {sid: prompt for r, prompt in merged for sid in r.step_ids}

    with engine.connect() as conn:
        exported = {
            s.id: s.prompt_ids
            for t in trajectories(conn, Filter(only_ok=False), {})
            for s in t.steps
        }
        api = {
            s["id"]: s["prompt_token_ids"]
            for k in range(3)
            for s in queries.get_session(conn, "acme", f"s{k}")["steps"]
        }
        one = rng.choice(list(want))
        single = queries.get_step(conn, "acme", one)["prompt_token_ids"]
        refs = conn.execute(select(func.count()).where(steps.c.prompt_ref_step.is_not(None)))
        referring = refs.scalar()
    assert exported == want
    assert api == want
    assert single == want[one]
    assert referring > 0  # the property is tested on references, not only whole rows


def test_an_export_that_leaves_out_the_referenced_step_still_rebuilds(engine):
    base = list(range(1, 500))
    failed = record("s", RawJson(orjson.dumps(base)), [[7, 8, 9]], status=500)
    ok = record("s", RawJson(orjson.dumps([*base, 7, 8, 9, 10, 11])), [[12]])
    write(engine, random.Random(0), [failed, ok])
    with engine.connect() as conn:
        (t,) = trajectories(conn, Filter(only_ok=True), {})
    assert [s.prompt_ids for s in t.steps] == [[*base, 7, 8, 9, 10, 11]]


def test_stored_ids_grow_linearly_with_the_session(engine):
    """A 60-step tool loop adding 300 ids a step: what is stored per step stays the step's
    new ids (a reference); stored whole it would be the whole history every time."""
    rng = random.Random(1)
    history = ids(rng, 2000)
    records = []
    for _ in range(60):
        prompt = history + ids(rng, 300)
        completion = ids(rng, 50)
        records.append(record("s", RawJson(orjson.dumps(prompt)), [completion]))
        history = prompt + completion
    write(engine, random.Random(2), records)  # with restarts: a few steps stored whole
    with engine.connect() as conn:
        stored = [
            len(b) // 4
            for b in conn.execute(select(steps.c.prompt_token_ids).order_by(steps.c.seq)).scalars()
        ]
    whole = [2000 + 350 * k + 300 for k in range(60)]
    referenced = [n for n in stored if n == 300]
    assert len(referenced) >= 40
    assert sum(stored) < sum(whole) / 5, (sum(stored), sum(whole))


@pytest.mark.parametrize(
    ("last", "new", "shared"),
    [
        ("[12,345]", "[12,3456]", 1),  # a longer id is not the same id
        ("[12,345,6]", "[12,345]", 2),  # a shorter prompt
        ("[12, 345]", "[12, 345, 7]", 2),  # spaced, as another server writes it
        ("[9,345]", "[12,345]", 0),  # nothing shared
    ],
)
def test_the_shared_part_ends_at_a_whole_id(last, new, shared, monkeypatch):
    monkeypatch.setattr("gateway.recording.prompt_ref.MIN_SHARED", 1)
    prev = Last(last.encode(), len(orjson.loads(last)), [("a", [])])
    enc, made = encode(prev, RawJson(new.encode()))
    got = orjson.loads(new)
    assert made is not None and made.count == len(got)
    if shared == 0:
        assert enc.ref is None
        return
    assert (enc.ref, enc.shared) == ("a", shared)
    packed = enc.ids or b""
    assert [int.from_bytes(packed[i : i + 4], "little", signed=True)
            for i in range(0, len(packed), 4)] == got[shared:]  # fmt: skip


@pytest.mark.parametrize(
    ("before", "now"),
    [
        ("[12,345,6]", "[12,345,6,7]"),  # all of the last one and more
        ("[12,345,6,7]", "[12,345]"),  # a shorter prompt
        ("[12,345,6]", "[12,3456,6]"),  # parting inside an id
        ("[12,345,6]", "[12,345,7]"),
        ("[12, 345, 6]", "[12, 345, 6, 8]"),  # spaced, as another server writes it
        ("[12,345]", "[12, 345, 9]"),  # spaced unlike the last one
        ("[9,345]", "[12,345]"),  # nothing shared
        ("[]", "[1,2]"),
        ("[1,2]", "[]"),
    ],
)
def test_a_prompt_stored_whole_is_the_same_bytes_with_a_template(before, now, monkeypatch):
    """A new session's prompt copies the packed ids it shares with the last prompt stored
    whole; what is stored is what packing the whole prompt gives, and it is the next
    prompt's template."""
    monkeypatch.setattr("gateway.recording.prompt_ref.MIN_SHARED", 1)
    template = Template()
    for data in (before, now):
        enc, made = encode(None, RawJson(data.encode()), template=template)
        want = orjson.loads(data)
        assert enc == Encoded(None, None, struct.pack(f"<{len(want)}i", *want))
        assert made is not None and made.count == len(want)
        assert template.last is not None and template.last.prompt == data.encode()
        assert template.packed == enc.ids


def test_a_prompt_continues_into_the_answer_it_extends():
    prompt = list(range(100, 100 + MIN_SHARED))
    prev = Last(orjson.dumps(prompt), len(prompt), [("first", [1, 2, 3]), ("second", [4, 5])])
    enc, _ = encode(prev, RawJson(orjson.dumps([*prompt, 4, 5, 6])))
    assert (enc.ref, enc.shared, enc.ids) == ("second", MIN_SHARED + 2, (6).to_bytes(4, "little"))


def test_a_downgrade_writes_every_prompt_whole_again(store_url):
    upgrade(store_url)
    engine = make_engine(store_url)
    rng = random.Random(3)
    merged = session(rng, "s", 12)
    try:
        write(engine, rng, [r for r, _ in merged])
        with engine.connect() as conn:
            assert conn.execute(
                select(func.count()).where(steps.c.prompt_ref_step.is_not(None))
            ).scalar()
        downgrade(store_url, "0005")
        with engine.connect() as conn:
            rows = dict(conn.execute(select(steps.c.id, steps.c.prompt_token_ids)).all())
    finally:
        engine.dispose()
    for r, prompt in merged:
        for sid in r.step_ids:
            want = None if prompt is None else orjson.dumps(prompt)
            got = rows[sid]
            decoded = None if r.prompt_token_ids is None else [
                int.from_bytes(got[i : i + 4], "little", signed=True) for i in range(0, len(got), 4)
            ]  # fmt: skip
            assert (None if decoded is None else orjson.dumps(decoded)) == want
    upgrade(store_url)  # and back up again


def test_prompt_ids_reach_the_writer_process_as_bytes_and_dead_letters_keep_them(tmp_path):
    """The frame carries a prompt's ids as one JSON string (the writer process parses no
    ints for them); ``to_record`` gives the writer the very bytes vLLM sent, and a dead
    letter keeps them as a JSON array that a replay reads back."""
    from gateway.recording.cut import cut_prompt_ids
    from gateway.recording.writer_process import BatchWriter, encode_step, to_record

    sent = b"[1,2,3,40000]"
    _, cut = cut_prompt_ids(b'{"id":"x","prompt_token_ids":' + sent + b',"choices":[]}')
    rec = record("s", cut, [[5]])
    frame = orjson.loads(b'{"records":[' + encode_step(rec).data + b"]}")
    assert frame["records"][0]["prompt_token_ids"] == sent.decode()
    back = to_record(frame["records"][0])
    assert isinstance(back, StepRecord) and isinstance(back.prompt_token_ids, RawJson)
    assert back.prompt_token_ids.data == sent
    dead = tmp_path / "dead.jsonl"
    BatchWriter(make_engine(f"sqlite:///{tmp_path}/unused.db"), dead, StepWriter())._dead_letter(
        back, ValueError("refused")
    )
    kept = to_record(orjson.loads(dead.read_bytes()))
    assert isinstance(kept, StepRecord) and kept.prompt_token_ids == [1, 2, 3, 40000]
