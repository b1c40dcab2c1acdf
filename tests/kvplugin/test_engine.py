"""KV compaction inside vLLM, on a tiny random Llama (no download), against a pure-torch
reference of the same model and the same compaction (tests/kvplugin/engine_run.py).

Each run starts vLLM's offline engine in the engine's environment (about a minute here).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from backends.provision import DEFAULT_MODEL, provision
from gateway.config import EmbeddedSettings

ENGINE = EmbeddedSettings().python
RUN = Path(__file__).with_name("engine_run.py")
COMPACTION = {"enabled": True, "trigger_tokens": 200, "budget": 160, "window": 16, "sinks": 4}
ASYNC = "kvplugin.scheduler.CompactingAsyncScheduler"
SYNC = "kvplugin.scheduler.CompactingScheduler"
BLOCK = 32
TOLERANCE = 1e-4  # float32 both sides; observed differences are ~5e-6


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    if not ENGINE.exists():
        pytest.skip(f"no engine environment at {ENGINE} (scripts/install.sh)")
    return provision(EmbeddedSettings().home, ENGINE, DEFAULT_MODEL), tmp_path_factory.mktemp("kv")


def engine_run(work: tuple[Path, Path], **run: Any) -> dict[str, Any]:
    tokenizer, out = work
    result = subprocess.run(
        [str(ENGINE), str(RUN), str(tokenizer), str(out), json.dumps(run)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "TQDM_DISABLE": "1"},
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    data: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    data["log"] = result.stdout
    return data


def max_diff(step: dict[str, list[float]], ref: str) -> float:
    return max(abs(a - b) for a, b in zip(step["vllm"], step[ref], strict=True))


def check_exact(data: dict[str, Any], compacted: set[str]) -> None:
    """Compacted requests keep the reference's tokens and match the compacted reference at
    every decode step (and not the full cache's); the others match the full reference."""
    assert {r["request"] for r in data["results"] if r["compacted"]} == compacted
    workers = {t["request"]: t for t in data["traces"] if t["side"] == "worker"}
    schedulers = {t["request"]: t for t in data["traces"] if t["side"] == "scheduler"}
    for r in data["results"]:
        steps = r["steps"]
        assert len(steps) == len(r["tokens"])
        assert all(max_diff(s, "ref_compacted") < TOLERANCE for s in steps), r["request"]
        if not r["compacted"]:
            continue
        worker, scheduler = workers[r["request"]], schedulers[r["request"]]
        assert worker["kept_positions"] == r["ref_kept"]
        assert worker["kept_tokens"] == scheduler["kept_tokens"] == COMPACTION["budget"]
        # the scheduler kept the blocks the worker compacted into and freed the rest
        kept_blocks = -(-COMPACTION["budget"] // BLOCK)
        assert scheduler["kept_blocks"] == worker["kept_blocks"][:kept_blocks]
        assert len(scheduler["freed_blocks"]) == -(-r["prompt_tokens"] // BLOCK) - kept_blocks
        # the compaction changed the answer's distribution: the reference is not vacuous
        assert max(max_diff(s, "ref_full") for s in steps[1:]) > 100 * TOLERANCE
    assert data["free_end"] == data["free_start"]  # every block came back


@pytest.mark.parametrize("scheduler", [ASYNC, SYNC])
def test_compaction_matches_the_reference(work: tuple[Path, Path], scheduler: str) -> None:
    """A long prompt next to a short one (batched decode, one compacted row), then a prompt
    that starts with the compacted one's first 4 blocks: the prefix cache must not serve the
    compacted blocks, and the new request, compacted in turn, must match too."""
    data = engine_run(
        work, compaction=COMPACTION, batches=[[300, 100], [[280, 0, 128]]], max_tokens=6,
        scheduler_cls=scheduler,
    )  # fmt: skip
    check_exact(data, {"0", "2"})
    assert data["log"].count("KV compaction: request") == 4  # scheduler + worker, twice


def test_shared_prefix_blocks_are_not_compacted(work: tuple[Path, Path]) -> None:
    """Two long prompts with a common prefix in one batch share blocks: neither is
    compacted (in-place moves would corrupt the other), and both answers are exact."""
    data = engine_run(
        work, compaction=COMPACTION, batches=[[300, [260, 0, 64]]], max_tokens=4,
        scheduler_cls=ASYNC,
    )  # fmt: skip
    check_exact(data, set())
    assert data["log"].count("shared through the prefix cache") == 2


def test_preempted_compacted_request_recovers(work: tuple[Path, Path]) -> None:
    """A KV pool of 14 usable blocks: two 224-token prompts, both compacted to 192 tokens
    (7 blocks each with the first decode slot), fill it; the first to cross a block
    boundary preempts the other, which is recomputed with a full cache. Every answer is
    complete, every step matches the compacted reference before the preemption and the
    full-cache one after it (both occur), and no block leaks."""
    data = engine_run(
        work, compaction={**COMPACTION, "budget": 192}, batches=[[224, 224]], max_tokens=60,
        max_model_len=384, kv_bytes=15 * BLOCK * 128 * 4 * 2, scheduler_cls=ASYNC,
    )  # fmt: skip
    assert "preempted; it recomputes with a full cache" in data["log"]
    assert data["free_end"] == data["free_start"]
    matched = []
    for r in data["results"]:
        assert r["compacted"] and len(r["tokens"]) == 60
        for s in r["steps"]:
            if max_diff(s, "ref_compacted") < TOLERANCE:
                matched.append("compacted")
            else:
                assert max_diff(s, "ref_full") < TOLERANCE
                matched.append("full")
    assert "full" in matched and matched.count("compacted") > 60
