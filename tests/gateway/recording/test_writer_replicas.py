"""Several writers on one store (one per gateway replica): a session's steps are numbered
0, 1, ... in the order they were committed, whichever writer wrote them.

The writer gives a step its number at the commit (``gateway.recording.batch.Pending.number``)
and checks what it remembers of a session against the store once a batch. These tests run
two real writer processes (``gateway.recording.writer_process``) that write interleaved
steps of the same sessions at once, on SQLite and PostgreSQL, and two writers in one
process taking turns on a session, for what depends on the numbers and the caches: the
prompts read back by reference, and the repeated tool call a step made on the other writer.
"""

from __future__ import annotations

import random
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, select

from gateway.recording.records import ChoiceCapture, StepRecord
from gateway.recording.writer import StepWriter
from gateway.recording.writer_process import encode, encode_batch, encode_step, read_frame
from gateway.store import prompt_refs
from gateway.store.database import make_engine, upgrade
from gateway.store.rows import session_key
from gateway.store.schema import rewards, steps


def step(session: str, k: int, prompt: list[int], completion: list[int], call: str) -> StepRecord:
    """Step ``k`` of a named session; its answer calls a tool with arguments ``call``."""
    answer = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"call-{session}-{k}",
                "type": "function",
                "function": {
                    "name": "run_shell",
                    "arguments": orjson.dumps({"cmd": call}).decode(),
                },
            }
        ],
    }
    return StepRecord(
        step_ids=[uuid.uuid4().hex], request_id=f"{session}-{k}", tenant="acme", api_key="k",
        endpoint="chat", request={"model": "auto", "messages": [{"role": "user", "content": "go"}]},
        external_session=session, task_id=None, group_id=None, created_at=time.time(),
        status=200, tier="fast", prompt_token_ids=prompt,
        choices=[ChoiceCapture(0, answer, completion, [-0.5] * len(completion), "tool_calls")],
    )  # fmt: skip


def sessions(rng: random.Random, count: int, length: int) -> list[list[StepRecord]]:
    """Agent sessions whose prompts grow by the last answer and a tool result a step."""
    out = []
    for s in range(count):
        prompt, made = [rng.randrange(151_000) for _ in range(100)], []
        for k in range(length):
            completion = [rng.randrange(151_000) for _ in range(20)]
            made.append(step(f"s{s}", k, list(prompt), completion, f"step {k}"))
            prompt += completion + [rng.randrange(151_000) for _ in range(30)]
        out.append(made)
    return out


def stored(engine: Engine) -> list[Any]:
    with engine.connect() as conn:
        rows = [r._mapping for r in conn.execute(select(steps))]
        whole = prompt_refs.prompt_ids(conn, rows)
    return [(r["session_id"], r["seq"], r["request_id"], whole[r["id"]]) for r in rows]


class WriterProcess:
    """A writer process spoken to as the recorder does: frames in, acknowledgements out."""

    def __init__(self, url: str, dead_letter: Path) -> None:
        self.dead_letter = dead_letter
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.recording.writer_process"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )  # fmt: skip
        self.send({"url": url, "dead_letter": str(dead_letter), "cpus": None, "hooks": []})
        self.batches = 0

    def send(self, message: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(encode(message))
        self.proc.stdin.flush()

    def write(self, records: list[StepRecord]) -> None:
        self.batches += 1
        assert self.proc.stdin is not None
        self.proc.stdin.write(encode_batch(self.batches, False, [encode_step(r) for r in records]))
        self.proc.stdin.flush()
        assert self.proc.stdout is not None
        ack = read_frame(self.proc.stdout)
        assert ack is not None and (ack["written"], ack["dead"]) == (len(records), 0), ack

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()


def test_two_writer_processes_number_one_session_without_gaps_or_repeats(
    store_url: str, tmp_path: Path
) -> None:
    upgrade(store_url)
    rng = random.Random(26)
    made = sessions(rng, count=6, length=16)
    # each writer gets a random share of every session's steps, in batches of 1 to 6 that
    # mix sessions, and both write at once
    shares: list[list[StepRecord]] = [[], []]
    for k in range(16):
        for session in made:
            shares[rng.randrange(2)].append(session[k])
    writers = [WriterProcess(store_url, tmp_path / f"dead-{i}.jsonl") for i in range(2)]
    failures: list[BaseException] = []

    def run(writer: WriterProcess, records: list[StepRecord]) -> None:
        sizes = random.Random(len(records))  # one generator per thread
        try:
            at = 0
            while at < len(records):
                n = sizes.randint(1, 6)
                writer.write(records[at : at + n])
                at += n
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    threads = [
        threading.Thread(target=run, args=pair) for pair in zip(writers, shares, strict=True)
    ]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        for w in writers:
            w.close()
    assert not failures, failures
    assert not any(w.dead_letter.exists() for w in writers)

    engine = make_engine(store_url)
    try:
        rows = stored(engine)
    finally:
        engine.dispose()
    sent = {r.request_id: r for session in made for r in session}
    assert sorted(r[2] for r in rows) == sorted(sent)  # each step once
    assert all(prompt == sent[request].prompt_token_ids for *_, request, prompt in rows)
    numbers: dict[str, list[int]] = defaultdict(list)
    for sid, seq, _, _ in rows:
        numbers[sid].append(seq)
    assert sorted(map(sorted, numbers.values())) == [list(range(16))] * 6  # no gap, no repeat
    # each writer's steps of a session are numbered in the order it committed them
    seq_of = {request: seq for _, seq, request, _ in rows}
    for share in shares:
        for s in range(6):
            mine = [seq_of[r.request_id] for r in share if r.external_session == f"s{s}"]
            assert mine == sorted(mine)


def test_writers_taking_turns_see_each_others_steps(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    upgrade(url)
    engine = make_engine(url)
    (session,) = sessions(random.Random(7), count=1, length=6)
    old = session[4]  # step 4 (writer A) repeats the call of step 1 (writer B)
    session[4] = step("s0", 4, old.prompt_token_ids, old.choices[0].token_ids, "step 1")  # type: ignore[arg-type]
    writers = [StepWriter(), StepWriter()]
    try:
        for k, rec in enumerate(session):  # A, B, A, B, ...
            with engine.begin() as conn:
                writers[k % 2].write(conn, [rec])
        rows = stored(engine)
        with engine.connect() as conn:
            repeated = conn.execute(
                select(steps.c.request_id)
                .join(rewards, rewards.c.step_id == steps.c.id)
                .where(rewards.c.name == "repeated_tool_call")
            ).scalars().all()  # fmt: skip
    finally:
        engine.dispose()
    assert {sid for sid, *_ in rows} == {session_key("acme", "s0")}
    assert sorted((seq, request) for _, seq, request, _ in rows) == [
        (k, f"s0-{k}") for k in range(6)
    ]
    for _, _, request, prompt in rows:
        assert prompt == session[int(request.rsplit("-", 1)[1])].prompt_token_ids
    assert repeated == ["s0-4"]
