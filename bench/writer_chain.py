"""Part 4 of ``bench.recorder``: what a named agent session's step costs the writer as the
session grows (#29).

A named session (``X-Session-Id``) reaches the writer without chain hashes: the writer
hashes the history itself, to link the step to the one it continues. Here ``sessions``
agents with distinct histories (``bench.agent_body.session_bodies``, one seed each) run
sessions of 10, 30 and 60 steps, steps of all sessions interleaved, 64 records to a frame
as the recorder hands them over (no prompt ids: the chain and the tool results are what
is measured). Two writers take turns on the same frames, in one run:

- ``full``: every step reduces and hashes its whole history (``history_cache_mb=0``);
- ``incremental``: a step hashes only what it adds, from the open hash its session's last
  step left (``gateway.store.chain.ChainCache``).

Figures: the writer's CPU-µs per step (frame parsing, records, rows, commit) and the
chain hashing alone (``chain.History``: prefix and continuation) per step and for the
sessions' last step (``chain_last_us``), best of the rounds; ``ratio`` is full over
incremental.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

import orjson
from sqlalchemy import Engine, insert

from bench.agent_body import session_bodies
from bench.writer_first_steps import frame_records, writer_cost
from gateway.recording.records import ChoiceCapture, RawJson, StepRecord
from gateway.recording.writer import StepWriter
from gateway.recording.writer_process import encode_batch, encode_step
from gateway.store import chain
from gateway.store.database import make_engine, upgrade
from gateway.store.rows import insert_ignore

LENGTHS = (10, 30, 60)
DONE = {"role": "assistant", "content": "Done."}


def steps_of(seed: int, length: int) -> list[tuple[list[Any], dict[str, Any], bytes]]:
    """A session of ``length`` steps: each step's messages, its answer (the next step's
    assistant message), and its request's bytes."""
    bodies = session_bodies(seed, length)[:length]
    out = []
    for k, body in enumerate(bodies):
        messages = body["messages"]
        following = bodies[k + 1]["messages"] if k + 1 < len(bodies) else None
        answer = following[len(messages)] if following is not None else DONE
        out.append((messages, answer, orjson.dumps(body)))
    return out


def frames(sessions: list[list[tuple[list[Any], dict[str, Any], bytes]]], tag: str) -> list[bytes]:
    """The sessions' steps as the recorder hands them to the writer process: step k of
    every session, then step k + 1, 64 encoded records to a frame; sessions named
    ``{tag}-{i}``."""
    records = []
    for k in range(len(sessions[0])):
        for s, steps in enumerate(sessions):
            _, answer, raw = steps[k]
            records.append(
                StepRecord(
                    step_ids=[uuid.uuid4().hex],
                    request_id=uuid.uuid4().hex,
                    tenant="bench",
                    api_key="k",
                    endpoint="chat",
                    request=RawJson(raw),
                    external_session=f"{tag}-{s}",
                    task_id=None,
                    group_id=None,
                    created_at=time.time(),
                    status=200,
                    tier="fast",
                    completion_tokens=60,
                    choices=[ChoiceCapture(0, answer, None, None, "tool_calls")],
                )
            )
    return [
        encode_batch(i, False, [encode_step(r) for r in records[at : at + 64]])
        for i, at in enumerate(range(0, len(records), 64))
    ]  # fmt: skip


def writer_us(engine: Engine, framed: list[bytes], history_cache_mb: float) -> float:
    """A new writer's CPU-µs per step over ``framed``."""
    writer = StepWriter(history_cache_mb=history_cache_mb)
    count, started = 0, time.process_time()
    for frame in framed:
        records = frame_records(frame)
        with engine.begin() as conn:
            writer.write(conn, records)
        count += len(records)
    return (time.process_time() - started) * 1e6 / count


def chain_us(
    sessions: list[list[tuple[list[Any], dict[str, Any], bytes]]], cached: bool
) -> tuple[float, float]:
    """The chain hashes alone (prefix and continuation), CPU-µs per step on average and
    for the sessions' last step; each step's messages parsed anew, as the writer gets them."""
    length = len(sessions[0])
    parsed = [
        (orjson.loads(orjson.dumps(steps[k][0])), steps[k][1])
        for k in range(length)
        for steps in sessions
    ]
    cache = chain.ChainCache() if cached else None
    total = last = 0.0
    for i, (messages, answer) in enumerate(parsed):
        started = time.process_time()
        history = chain.History(messages, cache)
        history.prefix()
        history.continuation(answer)
        spent = time.process_time() - started
        total += spent
        if i >= (length - 1) * len(sessions):
            last += spent
    return total * 1e6 / len(parsed), last * 1e6 / len(sessions)


def chain_runs(tmp: Path, quick: bool) -> dict[str, dict[str, float]]:
    """Both writers alternated on the same frames for each session length."""
    count, rounds = (2, 1) if quick else (16, 3)
    engines: dict[str, Engine] = {}
    for r in range(rounds):  # a database per writer and round, sessions per length
        for name in ("full", "incremental"):
            url = f"sqlite:///{tmp}/chain-{name}-{r}.db"
            upgrade(url)
            engines[f"{name}-{r}"] = make_engine(url)
    out: dict[str, dict[str, float]] = {}
    for length in LENGTHS:
        sessions = [steps_of(seed, length) for seed in range(count)]
        framed = frames(sessions, f"agent{length}")
        runs: dict[str, list[float]] = {"full": [], "incremental": []}
        hashes: dict[str, list[tuple[float, float]]] = {"full": [], "incremental": []}
        for r in range(rounds):
            for name, mb in (("full", 0.0), ("incremental", 64.0)):
                runs[name].append(writer_us(engines[f"{name}-{r}"], framed, mb))
                hashes[name].append(chain_us(sessions, mb > 0))
        best = {k: min(v) for k, v in runs.items()}
        alone = {k: min(a for a, _ in v) for k, v in hashes.items()}
        final = {k: min(f for _, f in v) for k, v in hashes.items()}
        out[str(length)] = {
            "writer_us": round(best["incremental"], 1), "writer_us_full": round(best["full"], 1),
            "ratio": round(best["full"] / best["incremental"], 3),
            "chain_us": round(alone["incremental"], 1), "chain_us_full": round(alone["full"], 1),
            "chain_ratio": round(alone["full"] / alone["incremental"], 2),
            "chain_last_us": round(final["incremental"], 1),
            "chain_last_us_full": round(final["full"], 1),
        }  # fmt: skip
        print(f"named sessions of {length} steps: writer {best['full']:.0f} -> "
              f"{best['incremental']:.0f} CPU-us/step; chain hashes alone {alone['full']:.0f} -> "
              f"{alone['incremental']:.0f} (the last step: {final['full']:.0f} -> "
              f"{final['incremental']:.0f})", flush=True)  # fmt: skip
    for engine in engines.values():
        engine.dispose()
    return out


def sqlalchemy_inserts(
    conn: Any, table: Any, rows: list[dict[str, Any]], ignore: bool = False
) -> None:
    """The writer's inserts as SQLAlchemy executes them (before ``batch.insert_rows``)."""
    if ignore:
        insert_ignore(conn, table, rows)
    elif rows:
        conn.execute(insert(table), rows)


def lookup_ab(tmp: Path, quick: bool) -> dict[str, Any]:
    """``--writer-ab`` (#29): 64 named sessions of 30 steps, step k of each to a frame (a
    gateway at 64 concurrent agents), written by the writer as it is and as it was (a
    query a step for the open calls a step's tool messages answer, and SQLAlchemy's own
    multi-row inserts), alternating in this process; CPU-µs per step (user + system, the
    collector run as the writer process runs it), each round and the median ratio."""
    import statistics

    from gateway.recording import batch, tool_calls

    fast_inserts, prefetch_ids = batch.insert_rows, tool_calls.PREFETCH_IDS
    count, length, rounds = (16, 10, 2) if quick else (64, 30, 5)
    framed = frames([steps_of(seed, length) for seed in range(count)], "ab")

    def once(now: bool, name: str) -> float:
        batch.insert_rows = fast_inserts if now else sqlalchemy_inserts
        tool_calls.PREFETCH_IDS = prefetch_ids if now else 0
        return writer_cost(f"sqlite:///{tmp}/ab-{name}.db", framed)[0]

    try:
        once(True, "warm")
        runs = []
        for r in range(rounds):
            was, now = once(False, f"was-{r}"), once(True, f"now-{r}")
            runs.append({"was_us": round(was, 1), "now_us": round(now, 1),
                         "ratio": round(now / was, 3)})  # fmt: skip
            print(f"writer A/B round {r + 1}: as it was {was:.0f}, as it is {now:.0f} "
                  f"CPU-us/step ({now / was:.2f}x)", flush=True)  # fmt: skip
    finally:
        batch.insert_rows, tool_calls.PREFETCH_IDS = fast_inserts, prefetch_ids
    ratio = statistics.median(r["ratio"] for r in runs)
    return {"writer_ab_ratio": ratio, "writer_ab": runs, "sessions": count, "steps": length}
