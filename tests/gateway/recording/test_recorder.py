"""The recorder's queue: full-queue policies, flush on shutdown, bad records kept aside."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import time
import uuid
from pathlib import Path

import orjson
import pytest
from sqlalchemy import func, select, text

from gateway.config import StoreSettings
from gateway.metrics import Metrics
from gateway.recording.recorder import Recorder
from gateway.recording.records import ChoiceCapture, RawJson, StepRecord
from gateway.store.chain import history_hash
from gateway.store.schema import steps, tool_calls


def rec(step_id: str | None = None, content: str = "x") -> StepRecord:
    return StepRecord(
        step_ids=[step_id or uuid.uuid4().hex], request_id=uuid.uuid4().hex, tenant="t",
        api_key="k", endpoint="chat", request={"messages": [{"role": "user", "content": content}]},
        external_session=None, task_id=None, group_id=None, created_at=time.time(), status=200,
        prompt_token_ids=[1, 2], choices=[ChoiceCapture(0, {"role": "assistant", "content": "y"}, [3], [-0.1])],
    )  # fmt: skip


def settings(tmp_path: Path, **kw) -> StoreSettings:
    return StoreSettings(
        url=f"sqlite:///{tmp_path}/r.db", dead_letter_path=str(tmp_path / "dead.jsonl"), **kw
    )


def count_steps(r: Recorder) -> int:
    assert r.engine is not None
    with r.engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(steps)).scalar() or 0)


class Paused:
    """Freeze the writer process (SIGSTOP) so batches stop being acknowledged."""

    def __init__(self, r: Recorder) -> None:
        assert r.writer_pid is not None
        self.pid = r.writer_pid
        os.kill(self.pid, signal.SIGSTOP)

    def set(self) -> None:
        os.kill(self.pid, signal.SIGCONT)


async def blocked(r: Recorder) -> Paused:
    """Pause a writer that has started (imports done, one batch written)."""
    await r.record(rec())
    await r.call(lambda conn: None)
    return Paused(r)


async def test_drop_policy_counts_every_drop(tmp_path):
    metrics = Metrics()
    r = Recorder(settings(tmp_path, queue_size=2, on_full="drop", linger_s=0), metrics)
    await r.start()
    gate = await blocked(r)
    assert await r.record(rec())  # taken by the writer, which now hangs
    await asyncio.sleep(0.05)
    assert await r.record(rec()) and await r.record(rec())  # fills the queue
    assert not await r.record(rec())
    assert not await r.record(rec())
    assert (
        metrics.registry.get_sample_value(
            "gearshift_recorder_dropped_total", {"reason": "queue_full"}
        )
        == 2
    )
    gate.set()
    await r.close()


async def test_the_queue_is_bounded_in_bytes_too(tmp_path):
    metrics = Metrics()
    r = Recorder(settings(tmp_path, queue_mb=1, on_full="drop", linger_s=0), metrics)
    await r.start()
    gate = await blocked(r)
    big = "x" * 400_000  # an agent's history: a few of them fill a megabyte
    assert await r.record(rec(content=big))  # taken by the writer, which now hangs
    await asyncio.sleep(0.05)
    assert await r.record(rec(content=big)) and await r.record(rec(content=big))
    assert not await r.record(rec(content=big))  # 1.2 MB would be over 1 MB
    assert await r.record(rec())  # a small step still fits
    queued = metrics.registry.get_sample_value("gearshift_recorder_queue_bytes")
    dropped = {"reason": "queue_full"}
    assert metrics.registry.get_sample_value("gearshift_recorder_dropped_total", dropped) == 1
    gate.set()
    await r.call(lambda conn: None)  # everything queued is written
    assert count_steps(r) == 5 and queued is not None
    assert metrics.registry.get_sample_value("gearshift_recorder_queue_bytes") == 0
    await r.close()


async def test_a_step_larger_than_the_bound_is_taken_when_the_queue_is_empty(tmp_path):
    r = Recorder(settings(tmp_path, queue_mb=1, on_full="drop", linger_s=0), Metrics())
    await r.start()
    assert await r.record(rec(content="x" * 2_000_000))
    await r.call(lambda conn: None)
    assert count_steps(r) == 1
    await r.close()


async def test_wait_policy_holds_the_request_then_drops(tmp_path):
    metrics = Metrics()
    r = Recorder(settings(tmp_path, queue_size=1, on_full="wait", wait_s=0.2, linger_s=0), metrics)
    await r.start()
    gate = await blocked(r)
    await r.record(rec())
    await asyncio.sleep(0.05)
    await r.record(rec())  # fills the queue
    t0 = time.perf_counter()
    assert not await r.record(rec())  # waited, no room came
    assert time.perf_counter() - t0 >= 0.19
    # Room that comes within wait_s is taken.
    asyncio.get_running_loop().call_later(0.05, gate.set)
    assert await r.record(rec())
    await r.close()
    assert (
        metrics.registry.get_sample_value(
            "gearshift_recorder_dropped_total", {"reason": "queue_full"}
        )
        == 1
    )


async def test_a_dead_writer_is_restarted_and_nothing_is_lost(tmp_path):
    metrics = Metrics()
    r = Recorder(settings(tmp_path, linger_s=0), metrics)
    await r.start()
    await r.record(rec())
    await r.call(lambda conn: None)
    first = r.writer_pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    for _ in range(5):
        await r.record(rec())
    await r.call(lambda conn: None)  # every step before it is committed
    assert r.writer_pid != first
    assert count_steps(r) == 6
    assert metrics.registry.get_sample_value("gearshift_recorder_retries_total") >= 1
    await r.close()


async def test_close_writes_everything_queued(tmp_path):
    r = Recorder(settings(tmp_path), Metrics())
    await r.start()
    for _ in range(300):
        assert await r.record(rec())
    await r.close()
    r2 = Recorder(settings(tmp_path), Metrics())
    await r2.start()
    assert count_steps(r2) == 300
    await r2.close()


async def test_a_record_the_database_refuses_goes_to_the_dead_letter_file(tmp_path):
    metrics = Metrics()
    r = Recorder(settings(tmp_path), metrics)
    await r.start()
    dup = uuid.uuid4().hex
    for item in (rec(dup), rec(dup), rec()):  # the second reuses a primary key
        await r.record(item)
    assert (
        await r.call(lambda conn: conn.execute(select(func.count()).select_from(steps)).scalar())
        == 2
    )
    lines = (tmp_path / "dead.jsonl").read_bytes().splitlines()
    assert [orjson.loads(x)["step_ids"] for x in lines] == [[dup]]
    assert (
        metrics.registry.get_sample_value(
            "gearshift_recorder_dropped_total", {"reason": "write_failed"}
        )
        == 1
    )
    await r.close()


def test_history_hash_reads_only_string_text_parts():
    odd = [
        {
            "role": "user",
            "content": [{"type": "text", "text": 2**63}, {"type": "text", "text": "hi"}],
        }
    ]
    plain = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    assert history_hash(odd) == history_hash(plain)


async def test_a_tool_result_is_queued_only_for_a_call_this_gateway_recorded(tmp_path):
    r = Recorder(settings(tmp_path, linger_s=0), Metrics())
    await r.start()
    step = rec()
    step.external_session = "agent-1"
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    step.choices = [ChoiceCapture(0, {"role": "assistant", "content": None, "tool_calls": [call]})]
    outcome = {"allowed": True, "exit_status": 0, "text": "ok", "attestation": "a"}
    assert await r.tool_result("t", "agent-1", "call_1", outcome) is None  # not made yet
    assert await r.record(step)
    assert await r.tool_result("t", "agent-1", "call_1", outcome) is True
    assert await r.tool_result("t", "agent-2", "call_1", outcome) is None  # another session
    assert await r.tool_result("other", "agent-1", "call_1", outcome) is None  # another tenant
    await r.call(lambda conn: None)
    assert r.engine is not None
    with r.engine.connect() as conn:
        status = conn.execute(select(tool_calls.c.status, tool_calls.c.attestation)).one()
    assert tuple(status) == ("ok", "a")
    await r.close()


async def test_a_low_priority_read_runs_on_a_nicer_thread_and_sees_the_steps(tmp_path):
    """The agent metrics' periodic query runs at niceness +LOW_NICE (Linux sets it per
    thread), so on a busy core the event loop's requests go first; it reads what is
    committed, like any read."""
    import threading

    from gateway.recording.recorder import LOW_NICE

    r = Recorder(settings(tmp_path, linger_s=0), Metrics())
    await r.start()
    await r.record(rec())
    await r.call(lambda conn: None)  # the step is committed

    def where(conn):
        tid = threading.get_native_id()
        n = conn.execute(select(func.count()).select_from(steps)).scalar()
        return tid, os.getpriority(os.PRIO_PROCESS, tid), n

    base = os.getpriority(os.PRIO_PROCESS, 0)
    low_tid, low_nice, low_n = await r.read(where, low=True)
    tid, nice, n = await r.read(where)
    assert (low_n, n) == (1, 1)
    assert low_nice == min(19, base + LOW_NICE)
    assert nice == base and tid != low_tid
    assert os.getpriority(os.PRIO_PROCESS, 0) == base  # the process itself is untouched
    await r.close()


async def test_a_backlog_of_large_steps_goes_in_frames_of_about_batch_mb(tmp_path):
    """A writer that fell behind leaves agent steps (~0.1 MB each) queued; the frame that
    carries them is built on the event loop, so the consumer cuts batches at ``batch_mb``
    (a step that would pass it opens the next batch) and every step still lands, in order."""
    metrics = Metrics()
    r = Recorder(settings(tmp_path, linger_s=0, batch_mb=1.0), metrics)
    await r.start()
    gate = await blocked(r)  # one small step written
    ids = [uuid.uuid4().hex for _ in range(12)]
    for i, step_id in enumerate(ids):
        assert await r.record(rec(step_id, content=f"{i:02d}" + "x" * 300_000))
    gate.set()
    await r.call(lambda conn: None)
    sizes = metrics.registry.get_sample_value("gearshift_recorder_batch_steps_count")
    total = metrics.registry.get_sample_value("gearshift_recorder_batch_steps_sum")
    assert total == 13
    assert sizes >= 1 + 12 / 3  # at most three 0.3 MB steps under 1 MB
    assert (
        metrics.registry.get_sample_value("gearshift_recorder_batch_steps_bucket", {"le": "4.0"})
        == sizes
    )
    assert r.engine is not None
    with r.engine.connect() as conn:  # SQLite's rowid: the order rows were inserted in
        stored = conn.execute(
            select(steps.c.id).where(steps.c.id.in_(ids)).order_by(text("rowid"))
        ).scalars()
        assert list(stored) == ids
    await r.close()


def test_a_batch_frame_carries_each_record_as_encoded_and_splits_back():
    from gateway.recording.writer_process import (
        HEADER,
        batch_body,
        batch_parts,
        encode_batch,
        encode_step,
        read_batch,
        split_batch,
    )  # fmt: skip

    records = [encode_step(rec(content=c)) for c in ("a", 'é\n"', "x" * 1000)]
    for batch, resend in ((1, False), (73, True)):
        body = batch_body(batch, resend, records)
        head, parts = split_batch(body)
        assert head == {"batch": batch, "resend": resend, "records": 3}
        # the bytes as encoded, not re-serialized
        assert [bytes(p) for p in parts] == [e.data for e in records]
        read = read_batch(io.BytesIO(encode_batch(batch, resend, records)))
        assert read is not None and read[0] == head
        assert [r.request for r in read[1]] == [orjson.loads(e.data)["request"] for e in records]
        frame = b"".join(batch_parts(batch, resend, records))  # its length first, counted
        assert HEADER.unpack(frame[: HEADER.size]) == (len(frame) - HEADER.size,)
    assert split_batch(batch_body(2, False, [])) == (
        {"batch": 2, "resend": False, "records": 0},
        [],
    )
    assert read_batch(io.BytesIO(b"")) is None


def test_a_record_entry_is_orjsons_encoding_with_the_raw_values_spliced_in_uncopied():
    from gateway.recording.cut import as_written, cut_prompt_ids
    from gateway.recording.writer_process import encode_step

    ids = b"[" + b",".join(b"%d" % i for i in range(5000)) + b"]"
    _, cut = cut_prompt_ids(b'{"id":"x","prompt_token_ids":' + ids + b',"choices":[]}')
    body = orjson.dumps({"messages": [{"role": "user", "content": 'nul \x00, "quoted"\n'}]})
    step = rec()
    step.request, step.prompt_token_ids = RawJson(body), cut
    step.choices[0].message = {"role": "assistant", "content": "\x00 in the record's own text"}
    entry = encode_step(step)
    # what orjson writes with each raw value as a fragment: the ids as a JSON string
    whole = orjson.dumps(
        step, default=lambda v: orjson.Fragment(v.quoted) if v is cut else as_written(v)
    )
    assert entry.data == whole and entry.size == len(whole)
    assert any(part is body for part in entry.parts)  # the request's bytes, not a copy
    assert orjson.loads(entry.data)["prompt_token_ids"] == ids.decode()
    plain = rec(content="no raw values")
    assert encode_step(plain).parts == (orjson.dumps(plain),)
    odd = rec()
    odd.request = object()  # type: ignore[assignment]
    with pytest.raises(TypeError):  # neither JSON nor raw bytes: refused, as before
        encode_step(odd)


@pytest.mark.parametrize("cut", [1, 5, 9])
def test_a_batch_frame_cut_short_or_miscounted_is_refused(cut):
    from gateway.recording.writer_process import batch_body, encode_step, split_batch

    body = batch_body(4, False, [encode_step(rec(content="a")), encode_step(rec(content="b"))])
    with pytest.raises(ValueError):
        split_batch(body[:-cut])


@pytest.mark.parametrize(
    "head", [b'{"batch":4,"resend":false,"records":3}', b'["not", "a header"]']
)
def test_a_batch_frame_whose_header_miscounts_or_is_no_header_is_refused(head):
    from gateway.recording.writer_process import HEADER, split_batch

    with pytest.raises(ValueError):
        split_batch(HEADER.pack(len(head)) + head)  # carries no record
    with pytest.raises(ValueError):
        split_batch(b"")
