"""The recorder's writer on new agent sessions: what a session's first step costs it (#29).

A request that names no session and continues no answer the writer knows of opens a new
session: its prompt ids are stored whole (there is no earlier step to refer to) and the
writer must ask the store whether another writer's step ends in the history's prefix.
``bench.gateway_overhead``'s agent-body cells are all such steps (one 39 KB body, sent
again and again), and so is every agent's first call. Two costs of the writer were cut
for them (``gateway.recording.writer``):

- the store lookup of those prefixes, one statement a step, is one a batch
  (``batch.continued``);
- a prompt stored whole copies the packed ids it shares with the last prompt stored
  whole, and parses only the rest (``prompt_ref.Template``): one agent's sessions open
  with the same system prompt and tool definitions.

Here the writer as it is and as it was (both switched off in this process) take turns on
the same frames: agent-sized first steps (``bench.agent_body``, 39 KB, 30 messages, about
9,850 prompt ids as an engine returns them, the chain hashes the request path sends, 64
records to a frame as the recorder hands them over), in three mixes of what the prompts
share:

- ``none``: every prompt its own ids;
- ``opening``: the ids of the system prompt and the tools (``agent_body``'s first message
  and tool list, 30 % of its bytes) the same in every prompt, the rest (task, history)
  each session's own; bodies of different seeds, as different tasks of one agent send;
- ``identical``: one body and its ids every time, as ``bench.gateway_overhead``'s
  agent-body cells send (the best case for the template).

Figures: the writer process's CPU-µs per step (user + system: frame parsing, records,
rows, the commit; the collector as the writer process runs it), each round, and the
median ratio as-it-is / as-it-was per mix.

    python -m bench.writer_first_steps [--quick] [--rounds N]
"""

from __future__ import annotations

import argparse
import gc
import io
import json
import random
import resource
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import orjson
from sqlalchemy import Engine

from bench.agent_body import agent_body
from gateway.recording import prompt_ref, writer
from gateway.recording.cut import cut_prompt_ids
from gateway.recording.records import ChainHashes, ChoiceCapture, RawJson, StepRecord
from gateway.recording.writer import StepWriter
from gateway.recording.writer_process import Record, encode_batch, encode_step, read_batch
from gateway.store import chain
from gateway.store.database import make_engine, upgrade

MIXES = ("none", "opening", "identical")
ANSWER = {"role": "assistant", "content": "The archive job now pages its orders; tests pass."}


def _ids(data: list[int]) -> RawJson:
    """The prompt's ids cut out of an answer as the request path does."""
    cut = cut_prompt_ids(b'{"prompt_token_ids":' + orjson.dumps(data) + b"}")[1]
    assert cut is not None
    return cut


def first_steps(mix: str, count: int) -> list[StepRecord]:
    """``count`` first steps of new sessions, prompts sharing what ``mix`` says."""
    rng = random.Random(7)
    base = agent_body(0)
    size = len(orjson.dumps(base)) // 4  # ids a prompt: about 4 bytes of the body a token
    opening = [rng.randrange(151_000) for _ in range(
        (len(orjson.dumps(base["messages"][0])) + len(orjson.dumps(base["tools"]))) // 4
    )]  # fmt: skip
    same = opening + [rng.randrange(151_000) for _ in range(size - len(opening))]
    records = []
    for n in range(count):
        body = base if mix == "identical" else agent_body(n)
        if mix == "identical":
            ids = same
        else:
            head = opening if mix == "opening" else [rng.randrange(151_000) for _ in opening]
            ids = head + [rng.randrange(151_000) for _ in range(size - len(head))]
        history = chain.History(body["messages"])
        records.append(
            StepRecord(
                step_ids=[uuid.uuid4().hex], request_id=uuid.uuid4().hex, tenant="bench",
                api_key="k", endpoint="chat", request=RawJson(orjson.dumps(body)),
                external_session=None, task_id=None, group_id=None, created_at=time.time(),
                status=200, tier="fast", prompt_token_ids=_ids(ids), completion_tokens=60,
                choices=[ChoiceCapture(0, ANSWER, list(range(1000, 1060)), [-0.5] * 60, "stop")],
                chain=ChainHashes(history.prefix(), [history.continuation(ANSWER)]),
            )
        )  # fmt: skip
    return records


def frames(records: list[StepRecord]) -> list[bytes]:
    return [
        encode_batch(i, False, [encode_step(r) for r in records[at : at + 64]])
        for i, at in enumerate(range(0, len(records), 64))
    ]  # fmt: skip


def _whole_parsed(data: bytes, template: prompt_ref.Template | None) -> bytes:
    """Before the template: every prompt stored whole is parsed whole."""
    return prompt_ref._pack(orjson.loads(data))


@contextmanager
def as_it_was(was: bool) -> Iterator[None]:
    """The writer before #29's first-step changes: a lookup a step, whole prompts parsed."""
    continued: Callable[..., Any] = getattr(writer, "continued")  # noqa: B009 - patched below
    whole = prompt_ref._whole
    if was:
        setattr(writer, "continued", lambda conn, asks: {})  # noqa: B010 - as it was
        prompt_ref._whole = _whole_parsed
    try:
        yield
    finally:
        setattr(writer, "continued", continued)  # noqa: B010
        prompt_ref._whole = whole


def frame_records(frame: bytes) -> list[Record]:
    """A batch frame's records, as the writer process reads them."""
    batch = read_batch(io.BytesIO(frame))
    assert batch is not None
    return batch[1]


class Cost(NamedTuple):
    """A writer's cost per step: CPU-µs (user + system), minor page faults, wall-clock µs."""

    cpu_us: float
    faults: float
    wall_us: float


def writer_cost(
    url: str,
    framed: list[bytes],
    records_of: Callable[[bytes], list[Record]] = frame_records,
    engine_of: Callable[[str], Engine] = make_engine,
) -> Cost:
    """A new writer's cost per step over ``framed`` into a new database (``url``, its
    engine made by ``engine_of``; the schema's upgrade not counted), each frame's records
    read by ``records_of``; the collector as the writer process runs it (off during a
    batch, a young collection after it)."""
    upgrade(url)
    engine = engine_of(url)
    w, steps = StepWriter(), 0
    gc.collect()
    gc.disable()
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    try:
        for frame in framed:
            records = records_of(frame)
            with engine.begin() as conn:
                w.write(conn, records)
            steps += len(records)
            del records
            gc.collect(0)
    finally:
        after = resource.getrusage(resource.RUSAGE_SELF)
        wall = time.perf_counter() - t0
        gc.enable()
        engine.dispose()
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return Cost(cpu * 1e6 / steps, (after.ru_minflt - before.ru_minflt) / steps, wall * 1e6 / steps)


def writer_us(url: str, framed: list[bytes], was: bool) -> float:
    """A new writer's CPU-µs per step over ``framed`` into a new database."""
    with as_it_was(was):
        return writer_cost(url, framed)[0]


def run(tmp: Path, quick: bool, rounds: int) -> dict[str, Any]:
    count = 64 if quick else 512
    out: dict[str, Any] = {"steps": count, "rounds": {}}
    for mix in MIXES:
        framed = frames(first_steps(mix, count))
        writer_us(str(f"sqlite:///{tmp}/warm-{mix}.db"), framed[:1], False)  # imports, caches
        runs = []
        for r in range(rounds):
            was = writer_us(f"sqlite:///{tmp}/{mix}-was-{r}.db", framed, True)
            now = writer_us(f"sqlite:///{tmp}/{mix}-now-{r}.db", framed, False)
            runs.append({"was_us": round(was, 1), "now_us": round(now, 1),
                         "ratio": round(now / was, 3)})  # fmt: skip
            print(f"{mix:9s} round {r + 1}: as it was {was:5.0f}, as it is {now:5.0f} "
                  f"CPU-us/step ({now / was:.2f}x)", flush=True)  # fmt: skip
        out["rounds"][mix] = runs
        out[f"ratio_{mix}"] = statistics.median(r["ratio"] for r in runs)
        out[f"now_us_{mix}"] = statistics.median(r["now_us"] for r in runs)
        out[f"was_us_{mix}"] = statistics.median(r["was_us"] for r in runs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="seconds: one round of 64 steps")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per mix (default 5)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    with tempfile.TemporaryDirectory(prefix="gearshift-bench-first-") as d:
        result = run(Path(d), args.quick, 1 if args.quick else args.rounds)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
