"""The writer's batching: whatever way steps are grouped into batches, the rows are the same.

The writer answers its lookups (a session's chain, the tool calls a result answers) from
caches of what it wrote and from the rows still pending in its batch, without writing them
first, and numbers the steps at the commit: these tests pin that a tool loop written step
by step and the same loop written in one batch give the same rows, and that a result resent
with every later step (as agents resend their history) is counted once.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, event, select

from gateway.recording.records import (
    ChainHashes,
    ChoiceCapture,
    RawJson,
    StepRecord,
    ToolResultRecord,
)
from gateway.recording.writer import StepWriter
from gateway.store import chain
from gateway.store.database import make_engine, upgrade
from gateway.store.schema import rewards, steps, tool_calls

SYSTEM = {"role": "system", "content": "You fix bugs."}
USER = {"role": "user", "content": "Fix the failing test."}


def call(i: int) -> dict[str, Any]:
    return {
        "id": f"call-{i}",
        "type": "function",
        "function": {"name": "run_shell", "arguments": f'{{"cmd": "step {i}"}}'},
    }


def loop(turns: int, task: str | None = None) -> list[StepRecord]:
    """An unnamed tool loop: each answer calls a tool; the next request carries the whole
    history, every earlier result included; the last answer is text. ``task``: the user's
    message in place of the usual one."""
    user = USER if task is None else {"role": "user", "content": task}
    messages: list[dict[str, Any]] = [SYSTEM, user]
    records = []
    for i in range(turns):
        answer = (
            {"role": "assistant", "content": None, "tool_calls": [call(i)]}
            if i < turns - 1
            else {"role": "assistant", "content": "Done."}
        )
        records.append(
            StepRecord(
                step_ids=[uuid.uuid4().hex],
                request_id=f"req-{i}",
                tenant="acme",
                api_key="k",
                endpoint="chat",
                request={"model": "auto", "messages": list(messages)},
                external_session=None,
                task_id=None,
                group_id=None,
                created_at=time.time(),
                status=200,
                tier="fast",
                prompt_token_ids=list(range(10 * (i + 1))),
                choices=[ChoiceCapture(0, answer, [1, 2], [-0.1, -0.2], "stop")],
            )
        )
        result = "error: no such file" if i == 1 else f"ok {i}"
        messages += [answer, {"role": "tool", "tool_call_id": f"call-{i}", "content": result}]
    return records


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    url = f"sqlite:///{tmp_path}/t.db"
    upgrade(url)
    return make_engine(url)


def write(engine: Engine, batches: list[list[StepRecord]]) -> None:
    writer = StepWriter()
    for batch in batches:
        with engine.begin() as conn:
            writer.write(conn, batch)


def tables(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        step_rows = conn.execute(
            select(steps.c.session_id, steps.c.seq, steps.c.request_id, steps.c.rewritten)
            .order_by(steps.c.seq)
        ).all()  # fmt: skip
        call_rows = conn.execute(
            select(tool_calls.c.call_id, tool_calls.c.result, tool_calls.c.status,
                   tool_calls.c.result_step_id).order_by(tool_calls.c.call_id)
        ).all()  # fmt: skip
        step_of = dict(conn.execute(select(steps.c.id, steps.c.request_id)).all())
        reward_rows = conn.execute(
            select(rewards.c.name, rewards.c.value, rewards.c.scope)
            .order_by(rewards.c.name, rewards.c.value)
        ).all()  # fmt: skip
    return {
        "sessions": {r.session_id for r in step_rows},
        "steps": [(r.seq, r.request_id, r.rewritten) for r in step_rows],
        "calls": [
            (c.call_id, c.result, c.status, step_of.get(c.result_step_id)) for c in call_rows
        ],
        "rewards": [tuple(r) for r in reward_rows],
    }


@pytest.mark.parametrize("grouping", ["one batch", "two batches", "batch per step"])
def test_a_tool_loop_gives_the_same_rows_however_it_is_batched(engine, grouping):
    records = loop(4)
    batches = {
        "one batch": [records],
        "two batches": [records[:2], records[2:]],
        "batch per step": [[r] for r in records],
    }[grouping]
    write(engine, batches)
    got = tables(engine)
    assert len(got["sessions"]) == 1  # the chain joined every step
    assert got["steps"] == [(i, f"req-{i}", False) for i in range(4)]
    # each call answered once, by the request that first carried its result
    assert got["calls"] == [
        ("call-0", "ok 0", "ok", "req-1"),
        ("call-1", "error: no such file", "error", "req-2"),
        ("call-2", "ok 2", "ok", "req-3"),
    ]
    successes = [r for r in got["rewards"] if r[0] == "tool_success"]
    assert sorted(successes) == [
        ("tool_success", -1.0, "tool_call"),
        ("tool_success", 1.0, "tool_call"),
        ("tool_success", 1.0, "tool_call"),
    ]


def test_hashes_from_the_request_path_are_used_as_given(engine):
    (rec,) = loop(1)
    history = chain.History(rec.request["messages"])  # type: ignore[index]
    given = ChainHashes(history.prefix(), [history.continuation(rec.choices[0].message)])
    rec.chain = given
    rec.request = RawJson(b'{"model":"auto","messages":[{"role":"user","content":"x"}]}')
    write(engine, [[rec]])
    with engine.connect() as conn:
        stored = conn.execute(select(steps.c.prefix_sha256, steps.c.continuation_sha256)).one()
    assert tuple(stored) == (given.prefix, given.continuations[0])


def test_hashes_that_do_not_match_the_choices_are_not_trusted(engine):
    (rec,) = loop(1)
    rec.chain = ChainHashes("p" * 64, [])  # one choice, no continuation: recomputed
    write(engine, [[rec]])
    with engine.connect() as conn:
        stored = conn.execute(select(steps.c.continuation_sha256)).scalar()
    want = chain.History(rec.request["messages"]).continuation(rec.choices[0].message)  # type: ignore[index]
    assert stored == want


def named(records: list[StepRecord], session: str = "agent-1") -> list[StepRecord]:
    for r in records:
        r.external_session = session
    return records


def sandbox_result(
    call_id: str, session: str = "agent-1", exit_status: int = 0
) -> ToolResultRecord:
    outcome = {"allowed": True, "exit_status": exit_status, "text": f"ran {call_id}",
               "duration_ms": 250.0, "attestation": f"att-{call_id}", "fault": None}  # fmt: skip
    return ToolResultRecord("acme", session, call_id, outcome, time.time())


def sandbox_rows(engine: Engine) -> tuple[list[Any], list[Any]]:
    with engine.connect() as conn:
        calls = conn.execute(
            select(tool_calls.c.call_id, tool_calls.c.status, tool_calls.c.exit_status,
                   tool_calls.c.attestation, tool_calls.c.result).order_by(tool_calls.c.call_id)
        ).all()  # fmt: skip
        rows = conn.execute(
            select(rewards.c.name, rewards.c.value, rewards.c.source)
            .where(rewards.c.scope == "tool_call").order_by(rewards.c.name, rewards.c.source)
        ).all()  # fmt: skip
    return [tuple(c) for c in calls], [tuple(r) for r in rows]


@pytest.mark.parametrize("grouping", ["one batch", "batch per record", "resent"])
def test_a_sandbox_result_lands_on_its_call_once_however_it_is_batched(engine, grouping):
    first, second = named(loop(2))  # first calls call-0; second carries its result
    result = sandbox_result("call-0")
    batches = {
        "one batch": [[first, result, second]],
        "batch per record": [[first], [result], [second]],
        "resent": [[first], [result], [result, second]],  # a batch resent after a crash
    }[grouping]
    write(engine, batches)
    calls, earned = sandbox_rows(engine)
    assert calls == [("call-0", "ok", 0, "att-call-0", "ran call-0")]
    # the sandbox's rewards, once; the step that carried the result adds none of its own
    assert earned == [("tool_seconds", -0.25, "sandbox"), ("tool_success", 1.0, "sandbox")]


def test_a_result_for_a_call_nobody_made_changes_nothing(engine):
    (step,) = named(loop(1))
    write(engine, [[step, sandbox_result("call-404")]])
    assert sandbox_rows(engine) == ([], [])


def stored_chain(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(steps.c.session_id, steps.c.rewritten, steps.c.prefix_sha256,
                   steps.c.continuation_sha256).order_by(steps.c.seq)
        ).all()  # fmt: skip
    return [tuple(r) for r in rows]


@pytest.mark.parametrize("restart", [False, True])
def test_a_named_session_links_its_steps_across_a_restart(engine, restart):
    """A named session's writer hashes the history itself, from the open hash its last step
    left; a writer just started has none and hashes it whole: the same hashes, linked."""
    records = named(loop(4))
    writers = [StepWriter(), StepWriter()] if restart else [StepWriter()] * 2
    for writer, batch in zip(writers, (records[:2], records[2:]), strict=True):
        with engine.begin() as conn:
            writer.write(conn, batch)
    rows = stored_chain(engine)
    assert {r[0] for r in rows} == {rows[0][0]} and not any(r[1] for r in rows)
    for rec, (_, _, prefix, cont) in zip(records, rows, strict=True):
        messages = rec.request["messages"]  # type: ignore[index]
        answer = rec.choices[0].message
        assert cont == chain.history_hash([*messages, answer])
        assert prefix == (chain.history_hash(messages[:-1]) if len(messages) > 2 else None)
    assert [r[2] for r in rows[1:]] == [r[3] for r in rows[:-1]]


def test_a_call_id_used_again_is_answered_again(engine):
    """Results resent with every step are looked up once; a call that reuses an answered
    call's id is open again, and its result is paired with it."""
    messages: list[dict[str, Any]] = [SYSTEM, USER]
    batches = []
    for i in range(4):
        answer = {"role": "assistant", "content": None, "tool_calls": [call(i % 2)]}
        (rec,) = named(loop(1))
        rec.request = {"model": "auto", "messages": list(messages)}
        rec.choices = [ChoiceCapture(0, answer, [1], [-0.1], "tool_calls")]
        batches.append([rec])
        messages += [
            answer,
            {"role": "tool", "tool_call_id": f"call-{i % 2}", "content": f"ok {i}"},
        ]
    write(engine, batches)
    with engine.connect() as conn:
        answered = conn.execute(
            select(tool_calls.c.call_id, tool_calls.c.result).order_by(tool_calls.c.created_at)
        ).all()  # fmt: skip
    assert [tuple(a) for a in answered] == [
        ("call-0", "ok 0"), ("call-1", "ok 1"), ("call-0", "ok 2"), ("call-1", None),
    ]  # fmt: skip


def test_a_named_session_resending_other_answers_stores_the_defined_hashes(engine):
    """A client that sends back another assistant message than the one it got: each step is
    a rewrite (``rewritten``), its hashes are still the definitions, and the writer hashed
    only what each request added to the session's last one."""
    records = named(loop(4))
    for r in records:  # the answers recorded are not the ones the next requests carry
        r.choices[0].message = {"role": "assistant", "content": f"other {r.request_id}"}
    writer = StepWriter()
    for r in records:
        with engine.begin() as conn:
            writer.write(conn, [r])
    with engine.connect() as conn:
        stored = conn.execute(
            select(steps.c.rewritten, steps.c.prefix_sha256, steps.c.continuation_sha256)
            .order_by(steps.c.seq)
        ).all()  # fmt: skip
    want = []
    for r in records:
        messages = r.request["messages"]  # type: ignore[index]
        history = chain.History(messages)
        want.append((r is not records[0], history.prefix(),
                     history.continuation(r.choices[0].message)))  # fmt: skip
    assert [tuple(s) for s in stored] == want
    assert writer._histories.request_hits == 3  # steps 2-4 extended the one before


def edited(records: list[StepRecord]) -> list[StepRecord]:
    """The tool loop of a client that sends back other answers than it got."""
    for r in records:
        r.choices[0].message = {"role": "assistant", "content": f"other {r.request_id}"}
    return records


@pytest.mark.parametrize("answers", ["resent", "edited"])
def test_writers_taking_turns_store_what_one_writer_does(tmp_path, answers):
    """What a writer knows of a session it wrote every step of (its continuations, its
    calls) spares lookups; a step by another writer makes it look up again: the same rows."""
    got = []
    for writers in ([StepWriter()] * 2, [StepWriter(), StepWriter()]):
        url = f"sqlite:///{tmp_path}/{len(got)}.db"
        upgrade(url)
        engine = make_engine(url)
        records = named(loop(5))
        for k, rec in enumerate(edited(records) if answers == "edited" else records):
            with engine.begin() as conn:
                writers[k % 2].write(conn, [rec])
        got.append(tables(engine))
        engine.dispose()
    assert got[0] == got[1]
    assert got[0]["steps"] == [(i, f"req-{i}", answers == "edited" and i > 0) for i in range(5)]
    # edited: the answers made no call, and the results name calls nobody made
    want = [] if answers == "edited" else [f"req-{i}" for i in range(1, 5)]
    assert [c[3] for c in got[0]["calls"]] == want


def test_a_session_this_writer_wrote_whole_needs_no_lookups(engine):
    """Whether a named step extends an answer of its session, and which calls its results
    answer, are known from what the writer wrote: no query for either."""
    queries: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: queries.append(a[2]))
    writer = StepWriter()
    for rec in edited(named(loop(4))):
        with engine.begin() as conn:
            writer.write(conn, [rec])
    assert not [q for q in queries if "continuation_sha256 =" in q]
    assert not [q for q in queries if "tool_calls.result IS NULL" in q]
    assert [r[2] for r in tables(engine)["steps"]] == [False, True, True, True]


def hashed(records: list[StepRecord]) -> list[StepRecord]:
    """The records with the chain hashes the request path sends."""
    for rec in records:
        history = chain.History(rec.request["messages"])  # type: ignore[index]
        rec.chain = ChainHashes(history.prefix(), [history.continuation(rec.choices[0].message)])
    return records


def test_unnamed_steps_find_their_sessions_in_one_statement_a_batch(engine):
    """The steps of a batch that name no session and continue nothing cached here (a new
    writer: every lookup misses its caches) are looked up together: one statement for
    the batch, not one a step; and each finds the session its history continues."""
    loops = [hashed(loop(3, f"task {n}")) for n in range(4)]
    write(engine, [[lp[0] for lp in loops]])  # four sessions' first steps
    queries: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: queries.append(a[2]))
    write(engine, [[lp[i] for lp in loops for i in (1, 2)]])  # a new writer: caches empty
    lookups = [q for q in queries if "steps.continuation_sha256" in q]
    assert len(lookups) == 1 and " IN (" in lookups[0]
    with engine.connect() as conn:
        rows = conn.execute(select(steps.c.request_id, steps.c.session_id)).all()
    by_request: dict[str, set[str]] = {}
    for request_id, sid in rows:
        by_request.setdefault(request_id, set()).add(sid)
    assert len(rows) == 12 and len({sid for _, sid in rows}) == 4  # three steps a session
    assert all(len(sids) == 4 for sids in by_request.values())


def test_a_step_found_in_the_store_and_one_linked_in_its_batch_agree(engine):
    """A batch's lookup reads the store before its steps; a step that continues one
    written earlier in the same batch is found by the writer's own link instead."""
    records = hashed(loop(4))
    write(engine, [records[:2]])
    write(engine, [records[2:]])  # a new writer: step 2 from the store, step 3 from step 2
    got = tables(engine)
    assert len(got["sessions"]) == 1
    assert got["steps"] == [(i, f"req-{i}", False) for i in range(4)]
