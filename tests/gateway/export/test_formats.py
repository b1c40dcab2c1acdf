"""Exports from a real store (SQLite after `alembic upgrade head`), read back with the targets'
own readers (pyarrow for verl's parquet; JSON lines for the rest)."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest

from gateway.cli.main import main
from gateway.export.formats import FORMATS, export
from gateway.export.load import Filter
from gateway.recording.records import ChoiceCapture, StepRecord
from gateway.recording.writer import StepWriter
from gateway.store.database import make_engine, upgrade
from gateway.store.rewards import DEFAULT_WEIGHTS

SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "Weather in Paris?"}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
CALL = {
    "id": "c1",
    "type": "function",
    "function": {"name": "weather", "arguments": '{"city":"Paris"}'},
}


def record(tenant: str, messages: list, answer: dict, prompt: list[int], completion: list[int], *,
           session: str | None = "s1", tier: str = "full", finish: str = "stop") -> StepRecord:  # fmt: skip
    return StepRecord(
        step_ids=[uuid.uuid4().hex], request_id=uuid.uuid4().hex, tenant=tenant, api_key="k",
        endpoint="chat", request={"model": "auto", "messages": messages, "tools": TOOLS},
        external_session=session, task_id="task", group_id="g", created_at=time.time(), status=200,
        tier=tier, model=f"m-{tier}", prompt_token_ids=prompt,
        choices=[ChoiceCapture(0, answer, completion, [-0.5] * len(completion), finish)],
        completion_tokens=len(completion),
    )  # fmt: skip


@pytest.fixture
def store(tmp_path: Path):
    url = f"sqlite:///{tmp_path}/t.db"
    upgrade(url)
    engine = make_engine(url)
    yield url, engine
    engine.dispose()


def write(engine, *records: StepRecord) -> None:
    with engine.begin() as conn:
        StepWriter().write(conn, list(records))


def agent_session(engine, tenant: str = "acme", session: str = "s1") -> None:
    """Two steps: a tool call on the fast tier, then the final answer on the full tier. The
    second prompt extends the first prompt + answer with the tool result's tokens (7, 8)."""
    a1 = {"role": "assistant", "content": None, "tool_calls": [CALL]}
    a2 = {"role": "assistant", "content": "Sunny."}
    tool = {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21C"}
    write(
        engine,
        record(tenant, [SYSTEM, USER], a1, [1, 2, 3], [4, 5, 6], session=session, tier="fast"),
        record(
            tenant, [SYSTEM, USER, a1, tool], a2, [1, 2, 3, 4, 5, 6, 7, 8], [9, 10], session=session
        ),
    )


def run(engine, fmt: str, out: Path, **flt) -> list[dict]:
    export(engine, fmt, out, Filter(**flt), DEFAULT_WEIGHTS, progress=False)
    if FORMATS[fmt].container == "parquet":
        return pq.read_table(out).to_pylist()
    return [orjson.loads(line) for line in out.read_bytes().splitlines()]


def test_verl_concatenates_a_linear_session_and_masks_tool_output(store, tmp_path):
    _, engine = store
    agent_session(engine)
    [row] = run(engine, "verl", tmp_path / "out.parquet")
    assert row["prompt_ids"] == [1, 2, 3]
    assert row["response_ids"] == [4, 5, 6, 7, 8, 9, 10]
    assert row["response_mask"] == [1, 1, 1, 0, 0, 1, 1]
    assert row["response_logprobs"] == [-0.5, -0.5, -0.5, 0.0, 0.0, -0.5, -0.5]
    assert [(s["start"], s["end"], s["tier"]) for s in row["tier_spans"]] == [
        (0, 3, "fast"),
        (5, 7, "full"),
    ]
    assert row["uid"] == "g"
    assert row["tool_rewards"] == [1.0]  # "sunny, 21C" reads as success


def test_openrlhf_action_ranges_index_observation_tokens(store, tmp_path):
    _, engine = store
    agent_session(engine)
    [row] = run(engine, "openrlhf", tmp_path / "out.jsonl")
    obs = row["observation_tokens"]
    assert obs == list(range(1, 11))
    assert row["action_ranges"] == [[3, 6], [8, 10]]
    assert [obs[a:b] for a, b in row["action_ranges"]] == [[4, 5, 6], [9, 10]]
    assert len(row["rollout_log_probs"]) == 5


def test_token_mismatch_or_rewrite_is_exported_step_by_step(store, tmp_path):
    _, engine = store
    a1 = {"role": "assistant", "content": "one"}
    summary = [SYSTEM, {"role": "user", "content": "summary so far"}]
    write(
        engine,
        record("acme", [SYSTEM, USER], a1, [1, 2], [3]),
        record("acme", summary, {"role": "assistant", "content": "two"}, [1, 9], [4]),
    )
    rows = run(engine, "verl", tmp_path / "v.parquet")
    assert [r["prompt_ids"] for r in rows] == [[1, 2], [1, 9]]
    sft = run(engine, "trl-sft", tmp_path / "t.jsonl")
    assert len(sft) == 2 and sft[1]["messages"][:2] == summary


def test_trl_sft_and_openai_sft_messages(store, tmp_path):
    _, engine = store
    agent_session(engine)
    [trl] = run(engine, "trl-sft", tmp_path / "t.jsonl")
    roles = [m["role"] for m in trl["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert trl["messages"][2]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert trl["tools"] == TOOLS
    assert [s["tier"] for s in trl["gearshift"]["steps"]] == ["fast", "full"]
    [oa] = run(engine, "openai-sft", tmp_path / "o.jsonl")
    assert [m.get("weight") for m in oa["messages"] if m["role"] == "assistant"] == [1, 1]
    assert oa["messages"][2]["tool_calls"][0]["function"]["arguments"] == '{"city":"Paris"}'
    [sw] = run(engine, "trl-stepwise", tmp_path / "s.jsonl")
    assert sw["prompt"] == "You are terse.\nWeather in Paris?"
    assert len(sw["completions"]) == len(sw["labels"]) == 2


def test_filters_tenant_and_min_reward(store, tmp_path):
    _, engine = store
    agent_session(engine, "acme", "s1")
    agent_session(engine, "other", "s1")
    lossless = run(engine, "jsonl", tmp_path / "all.jsonl")
    assert len(lossless) == 2
    only = run(engine, "jsonl", tmp_path / "acme.jsonl", tenant="acme")
    assert [r["session"]["tenant_id"] for r in only] == ["acme"]
    assert only[0]["steps"][1]["completion_ids"] == [9, 10]
    assert run(engine, "jsonl", tmp_path / "none.jsonl", min_reward=100.0) == []


def test_cli_export_and_clear_errors(store, tmp_path, capsys):
    url, engine = store
    agent_session(engine)
    out = tmp_path / "cli.parquet"
    assert main(["export", "--format", "verl", "--store", url, str(out)]) == 0
    assert "wrote 1 rows from 1 sessions" in capsys.readouterr().out
    assert pq.read_table(out).num_rows == 1
    with pytest.raises(SystemExit, match="--since wants an ISO date"):
        main(["export", "--format", "verl", "--store", url, "--since", "yesterday", str(out)])
    with pytest.raises(SystemExit, match="--weights wants"):
        main(["export", "--format", "jsonl", "--store", url, "--weights", "x", str(out)])
    with pytest.raises(SystemExit, match="revision None"):
        main(["export", "--format", "jsonl", "--store", f"sqlite:///{tmp_path}/empty.db", str(out)])
