"""The export registry and the one function the CLI calls."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from sqlalchemy import Engine
from tqdm import tqdm

from gateway.export import messages, tokens
from gateway.export.load import Filter, Trajectory, count, trajectories


def lossless(t: Trajectory) -> Iterator[dict[str, Any]]:
    """Everything the store holds about a session, token arrays decoded."""
    yield {
        "session": t.session,
        "reward": t.reward,
        "steps": [dataclasses.asdict(s) for s in t.steps],
        "tool_calls": t.tool_calls,
        "rewards": t.rewards,
        "feedback": t.feedback,
    }


Rows = Callable[[Trajectory], Iterator[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class Format:
    rows: Rows
    container: str  # "jsonl" | "parquet"
    help: str


FORMATS: dict[str, Format] = {
    "trl-sft": Format(messages.trl_sft, "jsonl", "TRL conversational SFT: messages, tools"),
    "trl-stepwise": Format(messages.trl_stepwise, "jsonl", "TRL stepwise supervision: prompt, completions, labels"),
    "openai-sft": Format(messages.openai_sft, "jsonl", "OpenAI fine-tuning JSONL with per-message weight"),
    "verl": Format(tokens.verl, "parquet", "verl agent loop: prompt_ids, response_ids, response_mask, response_logprobs"),
    "openrlhf": Format(tokens.openrlhf, "jsonl", "OpenRLHF: observation_tokens, action_ranges, rollout_log_probs, reward"),
    "jsonl": Format(lossless, "jsonl", "lossless: every stored field of every session"),
}  # fmt: skip

VERL_SCHEMA = pa.schema(
    [
        ("uid", pa.string()),
        ("session_id", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("response_ids", pa.list_(pa.int32())),
        ("response_mask", pa.list_(pa.int8())),
        ("response_logprobs", pa.list_(pa.float32())),
        ("reward_score", pa.float64()),
        ("turn_scores", pa.list_(pa.float64())),
        ("tool_rewards", pa.list_(pa.float64())),
        (
            "tier_spans",
            pa.list_(
                pa.struct(
                    [
                        ("start", pa.int32()),
                        ("end", pa.int32()),
                        ("tier", pa.string()),
                        ("step_id", pa.string()),
                    ]
                )
            ),
        ),
    ]
)


@dataclass(slots=True)
class ExportSummary:
    sessions: int = 0
    rows: int = 0


def export(
    engine: Engine,
    fmt: str,
    out: Path,
    flt: Filter,
    weights: Mapping[str, float],
    progress: bool = True,
) -> ExportSummary:
    spec = FORMATS[fmt]
    summary = ExportSummary()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".partial")  # a crash never leaves a half file under OUT
    with engine.connect() as conn:
        total = count(conn, flt)
        bar = tqdm(total=total, unit="session", desc=f"export {fmt}", disable=not progress)
        rows: list[dict[str, Any]] = []
        with tmp.open("wb") as f:
            for t in trajectories(conn, flt, weights):
                summary.sessions += 1
                for row in spec.rows(t):
                    summary.rows += 1
                    if spec.container == "jsonl":
                        f.write(
                            orjson.dumps(row, default=str, option=orjson.OPT_NON_STR_KEYS) + b"\n"
                        )
                    else:
                        rows.append(row)
                bar.update(1)
            bar.close()
        if spec.container == "parquet":
            pq.write_table(pa.Table.from_pylist(rows, schema=VERL_SCHEMA), tmp)
    tmp.replace(out)
    return summary
