"""Reward components and hooks."""

from __future__ import annotations

import time
import uuid

import pytest
from sqlalchemy import select

from gateway.cli.serve import _store_problem
from gateway.config import Settings
from gateway.recording.records import ChoiceCapture, StepRecord
from gateway.recording.writer import StepWriter
from gateway.store import rewards
from gateway.store.database import make_engine, upgrade
from gateway.store.schema import rewards as rewards_t
from gateway.store.schema import steps


def plan_hook(view):
    """A hook as a user would write one: scores the answer's text."""
    text = (view["answer"] or {}).get("content") or ""
    return {"plan_consistency": 1.0 if text.startswith("Plan:") else -1.0}


def broken_hook(view):
    raise RuntimeError("bug in a user's hook")


def test_api_correctness_is_an_f1_over_expected_actions():
    want = [{"name": "book", "arguments": {"flight": "AF1"}}, {"name": "pay", "arguments": {}}]
    assert (
        rewards.api_correctness(want, [("book", '{"flight": "AF1", "seat": "2A"}'), ("pay", "{}")])
        == 1.0
    )
    assert rewards.api_correctness(want, [("book", '{"flight": "BA2"}')]) == 0.0
    half = rewards.api_correctness(want, [("book", '{"flight":"AF1"}')])
    assert half == pytest.approx(2 / 3)  # precision 1, recall 1/2
    # each call matches one expected action; a duplicate does not count twice
    assert rewards.api_correctness(want[:1], [("book", '{"flight":"AF1"}')] * 2) == pytest.approx(
        2 / 3
    )
    assert rewards.api_correctness([], []) == 1.0
    assert rewards.api_correctness(want, [("book", "not json")]) == 0.0


def test_tool_outcome_from_text():
    assert rewards.tool_outcome_from_text("sunny, 21C")
    assert not rewards.tool_outcome_from_text("Error: city not found")
    assert not rewards.tool_outcome_from_text('{"error": "timeout"}')
    assert not rewards.tool_outcome_from_text("Traceback (most recent call last):\n ...")


def test_combined_uses_weights_and_ignores_unweighted():
    assert rewards.combined([("a", 1.0), ("b", -1.0), ("c", 5.0)], {"a": 2.0, "b": 0.5}) == 1.5


def test_bad_hook_specs_fail_with_their_name():
    with pytest.raises(ValueError, match=r"package\.module:function"):
        rewards.load_hooks(["nocolon"])
    with pytest.raises(ValueError, match="is not a function"):
        rewards.load_hooks(["tests.gateway.store.test_rewards:nothing_here"])


async def test_serve_refuses_a_bad_hook(tmp_path):
    s = Settings(store={"url": f"sqlite:///{tmp_path}/s.db"}, rewards={"hooks": ["nocolon"]})
    assert "rewards.hooks" in (await _store_problem(s) or "")


def test_hooks_add_components_and_a_failing_hook_loses_nothing(tmp_path):
    url = f"sqlite:///{tmp_path}/h.db"
    upgrade(url)
    engine = make_engine(url)
    hooks = rewards.load_hooks(
        [
            "tests.gateway.store.test_rewards:plan_hook",
            "tests.gateway.store.test_rewards:broken_hook",
        ]
    )
    rec = StepRecord(
        step_ids=[uuid.uuid4().hex], request_id="r", tenant="t", api_key="k", endpoint="chat",
        request={"messages": [{"role": "user", "content": "go"}]}, external_session=None,
        task_id=None, group_id=None, created_at=time.time(), status=200,
        choices=[ChoiceCapture(0, {"role": "assistant", "content": "Plan: 1. look"}, [1], [0.0], "stop")],
    )  # fmt: skip
    with engine.begin() as conn:
        StepWriter(hooks).write(conn, [rec])
    with engine.connect() as conn:
        assert conn.execute(select(steps.c.id)).scalar() == rec.step_ids[0]
        got = dict(conn.execute(select(rewards_t.c.name, rewards_t.c.value)).all())
    assert got["plan_consistency"] == 1.0
    engine.dispose()
