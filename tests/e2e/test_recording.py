"""Recording through the real stack: the store holds exactly the token ids and logprobs vLLM
produced, clients see what they asked for, and exports feed the trainers' own readers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pyarrow.parquet as pq
import pytest

from tests.e2e.test_embedded_stack import FULL, QUESTION, WEATHER_TOOL

pytestmark = pytest.mark.e2e


def step(stack, step_id: str) -> dict:
    r = httpx.get(f"{stack.url}/v1/steps/{step_id}", timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_stored_tokens_are_the_engines_and_hidden_unless_asked(real_stack):
    client = real_stack.client()
    plain = client.chat.completions.with_raw_response.create(
        model=FULL, messages=QUESTION, max_tokens=12, temperature=0
    )
    answer = plain.parse()
    assert answer.choices[0].logprobs is None
    assert answer.choices[0].model_extra.get("token_ids") is None  # vLLM's null: not asked
    assert answer.model_extra.get("prompt_token_ids") is None
    asked = client.chat.completions.with_raw_response.create(
        model=FULL, messages=QUESTION, max_tokens=12, temperature=0, logprobs=True,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    shown = asked.parse()
    got = step(real_stack, asked.headers["x-gearshift-step-id"])
    assert got["completion_token_ids"] == shown.choices[0].model_extra["token_ids"]
    assert got["prompt_token_ids"] == shown.model_extra["prompt_token_ids"]
    lps = [c.logprob for c in shown.choices[0].logprobs.content]
    assert got["logprobs"] == pytest.approx(lps, abs=1e-5)  # float32 storage
    # The unasked call stored the same greedy tokens it did not show.
    hidden = step(real_stack, plain.headers["x-gearshift-step-id"])
    assert hidden["completion_token_ids"] == got["completion_token_ids"]
    # The prompt ids are the engine's own tokenization of the chat.
    tok = httpx.post(f"{real_stack.full_url}/tokenize", json={"model": FULL, "messages": QUESTION})
    assert got["prompt_token_ids"] == tok.json()["tokens"]


def test_streamed_tokens_are_assembled_exactly(real_stack):
    raw = real_stack.client().chat.completions.with_raw_response.create(
        model="auto", messages=QUESTION, max_tokens=16, temperature=0, stream=True,
        extra_body={"return_token_ids": True},
    )  # fmt: skip
    ids: list[int] = []
    text = ""
    for chunk in raw.parse():
        for c in chunk.choices:
            ids += (c.model_extra or {}).get("token_ids") or []
            text += c.delta.content or ""
            assert c.logprobs is None  # not asked for, so not shown
    got = step(real_stack, raw.headers["x-gearshift-step-id"])
    assert got["completion_token_ids"] == ids and len(ids) > 0
    assert len(got["logprobs"]) == len(ids)
    assert got["response"]["content"] == text
    assert got["tier"] == raw.headers["x-gearshift-tier"]


def test_agent_session_exports_load_in_trainers(real_stack, tmp_path: Path):
    """A two-step tool-using session, exported as verl parquet (read back with pyarrow) and as
    TRL SFT (rendered with the model's own chat template, as TRL's SFTTrainer does)."""
    client = real_stack.client(default_headers={"x-session-id": "e2e-agent"})
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    first = client.chat.completions.with_raw_response.create(
        model=FULL, messages=messages, tools=[WEATHER_TOOL], max_tokens=40, temperature=0,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
    )  # fmt: skip
    msg = first.parse().choices[0].message
    (call,) = msg.tool_calls
    messages += [
        msg.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"},
    ]
    second = client.chat.completions.with_raw_response.create(
        model=FULL, messages=messages, tools=[WEATHER_TOOL], max_tokens=20, temperature=0
    )
    a = step(real_stack, first.headers["x-gearshift-step-id"])
    b = step(real_stack, second.headers["x-gearshift-step-id"])
    assert a["session_id"] == b["session_id"] and (a["seq"], b["seq"]) == (0, 1)

    gearshift = Path(sys.executable).with_name("gearshift")
    out = tmp_path / "verl.parquet"
    subprocess.run(
        [str(gearshift), "export", "--format", "verl", "--store", real_stack.store_url, str(out)],
        check=True, capture_output=True,
    )  # fmt: skip
    rows = [r for r in pq.read_table(out).to_pylist() if r["session_id"] == a["session_id"]]
    model_ids = [
        t for r in rows for t, m in zip(r["response_ids"], r["response_mask"], strict=True) if m
    ]
    assert model_ids == a["completion_token_ids"] + b["completion_token_ids"]
    assert rows[0]["prompt_ids"] == a["prompt_token_ids"]

    sft = tmp_path / "trl.jsonl"
    subprocess.run(
        [str(gearshift), "export", "--format", "trl-sft", "--store", real_stack.store_url, str(sft)],
        check=True, capture_output=True,
    )  # fmt: skip
    row = next(
        json.loads(line)
        for line in sft.read_text().splitlines()
        if json.loads(line)["gearshift"]["session_id"] == a["session_id"]
    )
    rendered = _render_with_model_template(row, tmp_path)
    assert "get_weather" in rendered and "sunny, 21 C" in rendered


def _render_with_model_template(row: dict, tmp: Path) -> str:
    """Apply the served model's chat template with transformers, in the engine's environment."""
    from gateway.config import EmbeddedSettings

    models = EmbeddedSettings().home / "models"
    model_dir = next(p for p in sorted(models.iterdir()) if "pruned" not in p.name and p.is_dir())
    (tmp / "row.json").write_text(json.dumps(row))
    script = (
        "import json, sys\n"
        "from transformers import AutoTokenizer\n"
        "row = json.load(open(sys.argv[2]))\n"
        "tok = AutoTokenizer.from_pretrained(sys.argv[1])\n"
        "print(tok.apply_chat_template(row['messages'], tools=row['tools'], tokenize=False))\n"
    )
    out = subprocess.run(
        [str(EmbeddedSettings().python), "-c", script, str(model_dir), str(tmp / "row.json")],
        check=True, capture_output=True, text=True, env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )  # fmt: skip
    return out.stdout
