"""bench.context_sessions: the sessions come from the sandbox's real tools, the same seed
gives the same bytes, every planned fact is in its step's output, no host path leaks in;
and the stored file is what the generator writes today (its first sessions regenerated)."""

from __future__ import annotations

import asyncio
import gzip
import os
import shutil
from pathlib import Path

import orjson
import pytest

from bench.context_data import DATA, load, manifest_path
from bench.context_sessions import VERSION, generate, plans, store

NEEDS_BWRAP = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("bwrap") is None,
    reason="the sandbox needs root and bubblewrap (./scripts/install.sh)",
)


def test_plans_depend_on_the_seed_and_the_index_only() -> None:
    three, five = plans(24, 3, (22, 30)), plans(24, 5, (22, 30))
    assert [p.calls for p in three] == [p.calls for p in five[:3]]  # more sessions: same first
    assert [p.family for p in five] == ["build", "data", "migration", "service", "build"]
    assert plans(25, 1, (22, 30))[0].calls != three[0].calls
    for p in five:
        assert 22 <= len(p.calls) <= 30
        kinds = sorted(f.kind for f in p.facts if f.step >= 0)
        assert kinds == ["code", "file", "number"]
        assert max(f.step for f in p.facts) < len(p.calls) // 3 + 1  # early in the session
        assert p.facts[-1].key == "check_result" and p.facts[-1].step == -1


@NEEDS_BWRAP
def test_two_sessions_from_the_real_tools_are_the_same_bytes_twice(tmp_path: Path) -> None:
    first = asyncio.run(generate(24, 2, (22, 30), 2))
    assert asyncio.run(generate(24, 2, (22, 30), 2)) == first
    store(first, tmp_path / "s.jsonl.gz", {})
    sessions = load(tmp_path / "s.jsonl.gz", VERSION)  # every answer in its step's output
    assert [s.family for s in sessions] == ["build", "data"]
    text = b"".join(first).decode()
    assert "/tmp" not in text and "gearshift-ctx" not in text  # the workspace's host path
    assert "Traceback (most recent call last)" in text  # a job's real failure
    assert "[exit status 1]" in text


@NEEDS_BWRAP
def test_the_stored_sessions_are_what_the_generator_writes() -> None:
    sessions = load(DATA, VERSION)
    manifest = orjson.loads(manifest_path(DATA).read_bytes())
    assert len(sessions) == manifest["count"] >= 200
    assert len({s.family for s in sessions}) == 4
    stored = gzip.decompress(DATA.read_bytes()).splitlines(keepends=True)
    steps = tuple(manifest["steps"])
    assert asyncio.run(generate(manifest["seed"], 2, steps, 2)) == stored[:2]
