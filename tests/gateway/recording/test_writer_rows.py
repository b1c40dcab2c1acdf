"""The writer reads the open calls a batch's tool messages may answer in one statement
(``ToolCalls.prefetch``) instead of one a step, the sessions its unnamed steps continue in
one more (``batch.continued``), packs a prompt stored whole from the last one's ids where
they agree (``prompt_ref.Template``), and hands SQLite its inserts as compiled tuples
(``batch.insert_rows``): every row it stores, byte for byte, is the one that the
step-by-step lookups, whole parses and SQLAlchemy's own inserts stored, on agent sessions
interleaved as a gateway's batches hold them (named and unnamed, several calls a step, a
call id used again, sandbox results, prompts that open alike, writers restarted)."""

from __future__ import annotations

import copy
import itertools
import sqlite3
import time
import uuid
from typing import Any

import orjson
import pytest
from sqlalchemy import event

from bench.writer_chain import sqlalchemy_inserts  # the writer's inserts before insert_rows
from gateway.recording import batch as batch_module
from gateway.recording import prompt_ref
from gateway.recording import tool_calls as tool_calls_module
from gateway.recording import writer as writer_module
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
from gateway.store.schema import blobs, context_events, rewards, sessions, steps, tool_calls

TOOLS = [
    {"type": "function", "function": {"name": "run_shell", "parameters": {
        "type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}},
    {"type": "function", "function": {"name": "read_file", "parameters": {
        "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
]  # fmt: skip


OPENING = list(range(5000, 5100))  # the ids every session's prompt opens with


def agent(s: int, turns: int, named: bool) -> list[StepRecord | ToolResultRecord]:
    """Session ``s``: each answer makes one to three calls (ids reused every third step, a
    bad argument now and then); every request resends the whole history; a named session's
    first call of a step is run in the sandbox."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You fix bugs."},
        {"role": "user", "content": f"Fix test {s}."},
    ]
    out: list[StepRecord | ToolResultRecord] = []
    for i in range(turns):
        calls = [
            {"id": f"c{s}-{i % 3}-{j}", "type": "function", "function": {
                "name": "run_shell" if j else "read_file",
                "arguments": f'{{"cmd": "step {i}"}}' if j else f'{{"path": {i if i == 2 else f"{i!r}"}}}'}}
            for j in range(1 + (s + i) % 3)
        ] if i < turns - 1 else []  # fmt: skip
        answer = {"role": "assistant", "content": None if calls else "Done.", "tool_calls": calls}
        request = {"model": "auto", "messages": list(messages), "tools": TOOLS}
        history = chain.History(request["messages"])
        rec = StepRecord(
            step_ids=[f"step-{s}-{i}"], request_id=f"req-{s}-{i}", tenant="acme", api_key="k",
            endpoint="chat", request=request,
            external_session=f"agent-{s}" if named else None, task_id=None, group_id=None,
            created_at=1_700_000_000.0 + i, status=200, tier="fast",
            choices=[ChoiceCapture(0, answer, [1, 2, 3], [-0.1, -0.2, -0.3], "tool_calls")],
            completion_tokens=3,
            prompt_token_ids=RawJson(orjson.dumps(
                OPENING + [s * 1000 + k for k in range(40 * len(messages))])),
            chain=None if named else ChainHashes(history.prefix(), [history.continuation(answer)]),
        )  # fmt: skip
        out.append(rec)
        if named and calls:
            outcome = {"allowed": True, "exit_status": i % 2, "text": f"ran {i}",
                       "duration_ms": 100.0, "attestation": f"att-{s}-{i}", "fault": None}  # fmt: skip
            out.append(ToolResultRecord("acme", f"agent-{s}", calls[0]["id"], outcome,
                                        1_700_000_000.5 + i))  # fmt: skip
        messages.append(answer)
        messages += [
            {"role": "tool", "tool_call_id": c["id"], "content": f"{'error' if i % 4 == 1 else 'ok'} {i}"}
            for c in calls
        ]  # fmt: skip
    return out


def interleaved(sessions: int, turns: int) -> list[StepRecord | ToolResultRecord]:
    """Step k of every session, then step k + 1, as concurrent agents reach the writer."""
    runs = [agent(s, turns, named=s % 2 == 0) for s in range(sessions)]
    steps_of = [
        [r for r in run if isinstance(r, StepRecord)] for run in runs
    ]  # with each its sandbox result right after it
    out: list[StepRecord | ToolResultRecord] = []
    for k in range(turns):
        for run, its_steps in zip(runs, steps_of, strict=True):
            at = run.index(its_steps[k])
            out.append(run[at])
            if at + 1 < len(run) and isinstance(run[at + 1], ToolResultRecord):
                out.append(run[at + 1])
    return out


TABLES = (sessions, blobs, steps, tool_calls, rewards, context_events)


def dump(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row as the database stores it: SQLite's values with their storage classes in
    rowid order; PostgreSQL's rows as text, by primary key."""
    out = {}
    if url.startswith("sqlite"):
        db = sqlite3.connect(url.removeprefix("sqlite:///"))
        for table in TABLES:
            cols = ", ".join(f"{c.name}, typeof({c.name})" for c in table.columns)
            sql = f"SELECT {cols} FROM {table.name} ORDER BY rowid"
            out[table.name] = db.execute(sql).fetchall()
        db.close()
        return out
    engine = make_engine(url)
    with engine.connect() as conn:
        for table in TABLES:
            pk = ", ".join(c.name for c in table.primary_key)
            sql = f"SELECT t::text FROM {table.name} AS t ORDER BY {pk}"
            out[table.name] = [tuple(r) for r in conn.exec_driver_sql(sql)]
    engine.dispose()
    return out


INSERT_ROWS = batch_module.insert_rows
CONTINUED, WHOLE = writer_module.continued, prompt_ref._whole


def no_batch_lookup(conn: Any, asks: Any) -> dict[Any, Any]:
    return {}  # every step's lookup its own, as before ``batch.continued``


def _whole_parsed(data: bytes, template: Any) -> bytes:
    return prompt_ref._pack(orjson.loads(data))


def run(
    url: str, batches: list[list[Any]], monkeypatch: Any, before: bool, restart: int = 0
) -> tuple[dict[str, Any], list[str]]:
    """Write ``batches``; ``before``: with a lookup a step, whole prompts parsed whole and
    SQLAlchemy's inserts; ``restart``: a new writer (empty caches) every so many batches."""
    counter = itertools.count()
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(int=next(counter)))
    monkeypatch.setattr(time, "time", lambda: 1_700_000_000.0)
    monkeypatch.setattr(tool_calls_module, "PREFETCH_IDS", 0 if before else 500)
    monkeypatch.setattr(batch_module, "insert_rows", sqlalchemy_inserts if before else INSERT_ROWS)
    monkeypatch.setattr(writer_module, "continued", no_batch_lookup if before else CONTINUED)
    monkeypatch.setattr(prompt_ref, "_whole", _whole_parsed if before else WHOLE)
    upgrade(url)
    engine = make_engine(url)
    queries: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: queries.append(a[2]))
    writer = StepWriter()
    for n, batch in enumerate(copy.deepcopy(batches)):
        if restart and n and n % restart == 0:
            writer = StepWriter()
        with engine.begin() as conn:
            writer.write(conn, batch)
    engine.dispose()
    return dump(url), queries


def check(urls: tuple[str, str], monkeypatch: Any, size: int, restart: int = 0) -> None:
    records = interleaved(sessions=6, turns=8)
    batches = [records[at : at + size] for at in range(0, len(records), size)]
    want, step_queries = run(urls[0], batches, monkeypatch, before=True, restart=restart)
    got, batch_queries = run(urls[1], batches, monkeypatch, before=False, restart=restart)
    assert got == want
    if restart:  # unnamed steps after a restart find their sessions in one statement a batch
        one = [q for q in step_queries if "steps.continuation_sha256 =" in q]
        many = [q for q in batch_queries if "steps.continuation_sha256 =" in q]
        assert len(many) < len(one)
        assert [q for q in batch_queries if "steps.continuation_sha256 IN" in q]
    assert len(want["tool_calls"]) > 40 and len(want["rewards"]) > 100
    per_step = [q for q in step_queries if "tool_calls.result IS NULL" in q]
    per_batch = [q for q in batch_queries if "tool_calls.result IS NULL" in q]
    assert len(per_batch) <= len(batches)
    if size > 1:
        assert len(per_batch) < len(per_step)


@pytest.mark.parametrize(("size", "restart"), [(1, 0), (7, 0), (64, 0), (7, 2), (12, 1)])
def test_the_batch_lookup_writes_the_rows_the_step_lookups_wrote(
    tmp_path, monkeypatch, size, restart
):
    urls = (f"sqlite:///{tmp_path}/before.db", f"sqlite:///{tmp_path}/now.db")
    check(urls, monkeypatch, size, restart)
    with sqlite3.connect(tmp_path / "before.db") as db:  # results stored, as text
        assert (
            db.execute("SELECT count(*) FROM tool_calls WHERE typeof(result) = 'text'").fetchone()[
                0
            ]
            > 20
        )


def test_the_same_rows_on_postgresql(postgres_admin_url, monkeypatch):
    from tests.support.postgres import fresh_database

    # named before ``run`` makes uuid4 count from 0
    urls = [fresh_database(postgres_admin_url, f"t_{uuid.uuid4().hex[:12]}") for _ in range(4)]
    check((urls[0], urls[1]), monkeypatch, 64)
    check((urls[2], urls[3]), monkeypatch, 7, restart=2)
