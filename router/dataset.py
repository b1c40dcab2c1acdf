"""Labelled routing examples as JSON lines: what ``gearshift router train|eval`` read.

One object per line::

    {"id": "rg/chain_sum/0/3", "group": "reasoning_gym/chain_sum",
     "body": {"messages": [...], "tools": [...], ...},   # the request as a client sends it
     "full": 1.0, "fast": 0.0}                            # checked scores of both tiers, 0..1

``python -m bench.router_eval --write-examples FILE`` writes this file from the evaluation
packages and the cached outcomes of both tiers; a team can write the same from its own
traffic (any request replayed on both tiers and checked).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from router.training import Example


class ExamplesError(ValueError):
    """The examples file is malformed; the message names the line."""


def _score(row: dict[str, Any], key: str, where: str) -> float:
    value = row.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ExamplesError(f"{where}: {key!r} must be a score between 0 and 1, got {value!r}")
    return float(value)


def read_examples(path: str | Path) -> list[Example]:
    examples = []
    with Path(path).open() as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ExamplesError(f"{where}: not JSON: {exc}") from None
            if not isinstance(row, dict) or not isinstance(row.get("body"), dict):
                raise ExamplesError(f"{where}: want an object with a 'body' object")
            examples.append(
                Example(
                    id=str(row.get("id", n)),
                    body=row["body"],
                    full=_score(row, "full", where),
                    fast=_score(row, "fast", where),
                    group=str(row.get("group", "")),
                )
            )
    if not examples:
        raise ExamplesError(f"{path}: no examples")
    return examples


def write_examples(path: str | Path, examples: list[Example]) -> None:
    with Path(path).open("w") as f:
        for ex in examples:
            row = {
                "id": ex.id,
                "group": ex.group,
                "body": ex.body,
                "full": ex.full,
                "fast": ex.fast,
            }
            f.write(json.dumps(row) + "\n")
