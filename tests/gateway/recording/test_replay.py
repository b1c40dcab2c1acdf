"""`gearshift db replay`: dead letters written once the store accepts them, nothing lost."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import orjson
import pytest
from sqlalchemy import func, select

from gateway.cli.main import main
from gateway.recording.records import ChoiceCapture, StepRecord
from gateway.store import database
from gateway.store.schema import steps


def rec(*step_ids: str) -> StepRecord:
    ids = list(step_ids) or [uuid.uuid4().hex]
    return StepRecord(
        step_ids=ids, request_id=uuid.uuid4().hex, tenant="t", api_key="k", endpoint="chat",
        request={"messages": [{"role": "user", "content": "x"}]}, external_session=None,
        task_id=None, group_id=None, created_at=time.time(), status=200, prompt_token_ids=[1],
        choices=[ChoiceCapture(i, {"role": "assistant", "content": "y"}, [3], [-0.1]) for i in range(len(ids))],
    )  # fmt: skip


def count(url: str) -> int:
    engine = database.make_engine(url)
    with engine.connect() as conn:
        n = int(conn.execute(select(func.count()).select_from(steps)).scalar() or 0)
    engine.dispose()
    return n


def test_replay_writes_skips_and_keeps(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    url = f"sqlite:///{tmp_path}/s.db"
    database.upgrade(url, "head")
    dead = tmp_path / "dead.jsonl"
    first, second = rec(), rec()
    broken = rec("same", "same")  # two choices with one id: the store refuses it every time
    lines = [orjson.dumps(r) for r in (first, second, broken)] + [b"not json"]
    dead.write_bytes(b"\n".join(lines) + b"\n")

    assert main(["db", "replay", "--store", url, "--file", str(dead)]) == 1
    said = capsys.readouterr().out
    assert "2 steps written, 0 already in the store, 1 refused again, 1 unreadable" in said
    assert count(url) == 2
    left = dead.read_bytes().splitlines()
    assert len(left) == 2 and b"not json" in left
    assert orjson.loads(next(x for x in left if x != b"not json"))["step_ids"] == ["same", "same"]
    assert not list(tmp_path.glob("dead.jsonl.replaying-*"))

    # a replay is repeatable: what is in the store is skipped, what fails stays
    dead.write_bytes(dead.read_bytes() + orjson.dumps(first) + b"\n")
    assert main(["db", "replay", "--store", url, "--file", str(dead)]) == 1
    assert "0 steps written, 1 already in the store, 1 refused again" in capsys.readouterr().out
    assert count(url) == 2


def test_nothing_to_replay(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    url = f"sqlite:///{tmp_path}/s.db"
    database.upgrade(url, "head")
    assert main(["db", "replay", "--store", url, "--file", str(tmp_path / "none.jsonl")]) == 0
    assert "0 steps written" in capsys.readouterr().out
