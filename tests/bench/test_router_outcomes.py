"""The outcome files' header line: what produced them, read back for the models' records."""

from __future__ import annotations

import json
from pathlib import Path

from bench.router_outcomes import DEFAULT_OUT, SAMPLED_OUT, header, load


def test_header_is_the_first_line_and_not_an_outcome(tmp_path: Path):
    path = tmp_path / "o.jsonl"
    row = {"key": "k", "id": "i", "full": {"score": 1.0}, "fast": {"score": 0.0}}
    path.write_text(
        json.dumps({"models": ["m"], "fast_tier": {"mode": "lossy"}})
        + "\n"
        + json.dumps(row)
        + "\n"
    )
    assert header(path)["fast_tier"] == {"mode": "lossy"}
    assert list(load(path)) == ["k"]
    headless = tmp_path / "h.jsonl"
    headless.write_text(json.dumps(row) + "\n")
    assert header(headless) == {}
    empty = tmp_path / "e.jsonl"
    empty.write_text("")
    assert header(empty) == {}


def test_shipped_outcomes_name_the_fast_tier_they_measured():
    for path in (DEFAULT_OUT, SAMPLED_OUT):
        assert header(path)["fast_tier"]["prune_remove"] == 4
