"""Cleaning up after a crashed sandbox service never takes another live service's cgroups."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from sandbox.runtime.cgroups import ROOT, remove_stale


def _parent() -> Path:
    v2 = (ROOT / "cgroup.controllers").exists()
    return ROOT / "gearshift" if v2 else ROOT / "pids" / "gearshift"


@pytest.fixture
def parent() -> Path:
    p = _parent()
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        pytest.skip(f"cannot create cgroups here: {exc}")
    return p


def test_only_old_empty_cgroups_are_removed(parent):
    young = parent / f"test-young-{uuid.uuid4().hex[:8]}"  # another service's, just made
    old = parent / f"test-old-{uuid.uuid4().hex[:8]}"  # a crashed service's
    young.mkdir()
    old.mkdir()
    (old / "call").mkdir()  # a warm session's call cgroup, empty too
    an_hour_ago = time.time() - 3600
    os.utime(old, (an_hour_ago, an_hour_ago))
    try:
        remove_stale()
        assert young.is_dir() and not old.exists()
    finally:
        for d in (young, old / "call", old):
            if d.exists():
                d.rmdir()
