"""KV compaction inside vLLM, on a tiny random Llama (no download), against a pure-torch
reference of the same model and the same compaction (tests/kvplugin/engine_session.py).

One subprocess in the engine's environment runs every scenario: an engine per scheduler
class (about a minute each to start here), the scenarios one after the other on it, in a
14-block KV pool that each scenario fills. The tests below read its report.
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
ROOT = Path(__file__).resolve().parents[2]
RUN = Path(__file__).with_name("engine_session.py")
COMPACTION = {"enabled": True, "trigger_tokens": 200, "budget": 160, "window": 16, "sinks": 4}
ASYNC = "kvplugin.scheduler.CompactingAsyncScheduler"
SYNC = "kvplugin.scheduler.CompactingScheduler"
BLOCK = 32
# float32 both sides; observed differences are ~5e-6
TOLERANCE = 1e-4
# 15 blocks of 32 tokens x 1 KV head x 64 dims x (K, V) x 4 bytes x 2 layers: 14 usable
KV_BYTES = 15 * BLOCK * 64 * 2 * 4 * 2

# A long prompt next to a short one (batched decode, one compacted row), then a prompt that
# starts with the compacted one's first 4 blocks: the prefix cache must not serve the
# compacted blocks, and the new request, compacted in turn, must match too.
MAIN = {"name": "main", "batches": [[300, 100], [[280, 0, 128]]], "max_tokens": 6}
# Two long prompts with a common prefix in one batch share blocks (8 + 8 - 2 = 14).
SHARED = {"name": "shared", "batches": [[240, [232, 0, 64]]], "max_tokens": 4}
# Two 224-token prompts compacted to 160 tokens outgrow the pool at their 65th token
# (8 blocks each): one is preempted and recomputed with a full cache.
PREEMPT = {"name": "preempt", "batches": [[224, 224]], "max_tokens": 72}
# The watermark trigger: 220 + 180 tokens hold 13 of the 14 blocks, under the 95% mark;
# the longer one's 5th token takes the 14th (100%): it is compacted mid-decode (the longest
# first) to 64 + 5 tokens in 3 blocks (9 of 14 left in use, under 75%), the other is not.
# A long prompt and one that shares its first 3 blocks, in one batch (8 + 4 of 14 blocks),
# kept to 32 tokens: the first's blocks are shared, so its kept tokens are gathered into a
# fresh block (1 of the 2 free) and its old ones released; the second's are then its own
# alone and it is compacted in place, after the gather has read them.
GATHER = {
    "name": "gather",
    "batches": [[230, [216, 0, 96]]],
    "max_tokens": 6,
    "compaction": {"budget": 32},
}
WATERMARK = {
    "name": "watermark", "batches": [[220, 180]], "max_tokens": 16,
    "compaction": {"trigger": "watermark", "trigger_tokens": 150, "budget": 64,
                   "high_watermark": 0.95, "low_watermark": 0.75},
}  # fmt: skip
# The watermark trigger and a preemption before it: two long prompts sharing 2 blocks fill
# the pool (14 of 14) and cannot be compacted (shared, and no block free to gather into);
# the first's 17th token needs a block, so the second is preempted; the first, then sole
# owner of its blocks, is compacted (9 of 14 in use, over the 50% mark); the second resumes,
# recomputed whole (the compacted blocks left the prefix cache), over the mark again, and is
# compacted with the tokens it had decoded, with the window's queries kept from its prefill.
PREEMPTED = {
    "name": "preempted", "batches": [[240, [232, 0, 64]]], "max_tokens": 24,
    "compaction": {"trigger": "watermark", "trigger_tokens": 150, "budget": 64,
                   "high_watermark": 0.5, "low_watermark": 0.3},
}  # fmt: skip
SESSION = {
    "compaction": COMPACTION,
    "engine": {
        "max_model_len": 384,
        "max_num_batched_tokens": 2048,
        "kv_cache_memory_bytes": KV_BYTES,
    },
    "engines": [
        {
            "scheduler_cls": ASYNC,
            "scenarios": [MAIN, SHARED, PREEMPT, WATERMARK, GATHER, PREEMPTED],
        },
        {"scheduler_cls": SYNC, "scenarios": [MAIN, WATERMARK]},
    ],
}


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not ENGINE.exists():
        pytest.skip(f"no engine environment at {ENGINE} (scripts/install.sh)")
    tokenizer = provision(EmbeddedSettings().home, ENGINE, DEFAULT_MODEL)
    out = tmp_path_factory.mktemp("kv")
    # this checkout's kvplugin, wherever the engine's editable install points
    env = {**os.environ, "TQDM_DISABLE": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [str(ENGINE), str(RUN), str(tokenizer), str(out), json.dumps(SESSION)],
        capture_output=True, text=True, timeout=900, env=env,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout[-3000:], result.stderr[-3000:])
    data: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    data["log"] = result.stdout + result.stderr
    return data


def max_diff(step: dict[str, list[float]], ref: str) -> float:
    return max(abs(a - b) for a, b in zip(step["vllm"], step[ref], strict=True))


def check_exact(
    data: dict[str, Any], compacted: set[str], budget: int = COMPACTION["budget"]
) -> None:
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
            assert r["record"] is None
            continue
        worker, scheduler = workers[r["request"]], schedulers[r["request"]]
        assert worker["kept_positions"] == r["ref_kept"]
        assert worker["kept_tokens"] == scheduler["kept_tokens"] == budget
        assert worker["cached_tokens"] == scheduler["cached_tokens"]
        # the scheduler kept the blocks the worker compacted into and released the rest (all
        # of them when it gathered into fresh ones); the tokens decoded before the compaction
        # (watermark trigger) are kept too
        decoded = scheduler["cached_tokens"] - r["prompt_tokens"]
        kept_blocks = -(-(budget + decoded) // BLOCK)
        assert scheduler["held_blocks"] == -(-scheduler["cached_tokens"] // BLOCK)
        assert len(scheduler["kept_blocks"]) == kept_blocks
        assert scheduler["kept_blocks"] == worker["kept_blocks"][:kept_blocks]
        released = len(scheduler["released_blocks"])
        if scheduler["gathered"]:
            assert released == scheduler["held_blocks"]
            assert not set(scheduler["kept_blocks"]) & set(scheduler["released_blocks"])
        else:
            assert released == scheduler["held_blocks"] - kept_blocks
        # the compaction changed the answer's distribution: the reference is not vacuous
        assert max(max_diff(s, "ref_full") for s in steps[1:]) > 100 * TOLERANCE
    check_records(data)
    assert data["free_after"] == data["free_before"]  # every block came back


def check_records(data: dict[str, Any]) -> None:
    """Each compacted request's answer carries its record (kv_transfer_params), and the
    plugin's Prometheus counters gained exactly the records' sums."""
    schedulers = {t["request"]: t for t in data["traces"] if t["side"] == "scheduler"}
    records = [r["record"] for r in data["results"] if r["compacted"]]
    for r in data["results"]:
        if r["compacted"]:
            trace, record = schedulers[r["request"]], r["record"]
            assert record["prompt_tokens"] == r["prompt_tokens"] == trace["prompt_tokens"]
            assert record["kept_tokens"] == trace["kept_tokens"]
            assert record["cached_tokens"] == trace["cached_tokens"]
            assert record["evicted_tokens"] == r["prompt_tokens"] - trace["kept_tokens"]
            assert record["freed_blocks"] == trace["held_blocks"] - len(trace["kept_blocks"])
            assert 0 < record["seconds"] < 60  # the worker's time reached the scheduler
    counters = data["counters"]
    assert counters["gearshift_kv_compactions"] == len(records)
    for name, field in (
        ("gearshift_kv_compaction_evicted_tokens", "evicted_tokens"),
        ("gearshift_kv_compaction_freed_blocks", "freed_blocks"),
        ("gearshift_kv_compaction_seconds", "seconds"),
    ):
        assert counters[name] == pytest.approx(sum(r[field] for r in records))


@pytest.mark.parametrize("scheduler", [ASYNC, SYNC])
def test_compaction_matches_the_reference(session: dict[str, Any], scheduler: str) -> None:
    check_exact(session[scheduler]["main"], {"0", "2"})
    assert session[scheduler]["main"]["counters"]["gearshift_kv_compactions"] == 2


def test_every_compaction_is_logged(session: dict[str, Any]) -> None:
    workers = sum(
        t["side"] == "worker"
        for scenarios in session.values() if isinstance(scenarios, dict)
        for s in scenarios.values() for t in s["traces"]
    )  # fmt: skip
    # main and watermark on both engines, preempt, gather, preempted
    assert workers == 2 + 2 + 2 + 2 + 2 + 2
    assert session["log"].count("KV compaction: request") == 2 * workers  # scheduler + worker


def test_shared_prefix_blocks_are_not_compacted(session: dict[str, Any]) -> None:
    """Two long prompts sharing blocks in one batch: neither is compacted (in-place moves
    would corrupt the other), and both answers are exact."""
    data = session[ASYNC]["shared"]
    check_exact(data, set())
    assert data["counters"]["gearshift_kv_compactions"] == 0
    # here, and once for each of the two requests of the "preempted" scenario
    assert session["log"].count("shared through the prefix cache") == 2 + 2


def test_preempted_compacted_request_recovers(session: dict[str, Any]) -> None:
    """Every answer is complete, every step matches the compacted reference before the
    preemption and the full-cache one after it (both occur), the record says the request
    was recomputed, and no block leaks."""
    data = session[ASYNC]["preempt"]
    assert "preempted; it recomputes with a full cache" in session["log"]
    assert data["free_after"] == data["free_before"]
    matched = []
    for r in data["results"]:
        assert r["compacted"] and len(r["tokens"]) == PREEMPT["max_tokens"]
        for s in r["steps"]:
            if max_diff(s, "ref_compacted") < TOLERANCE:
                matched.append("compacted")
            else:
                assert max_diff(s, "ref_full") < TOLERANCE
                matched.append("full")
    assert "full" in matched and matched.count("compacted") > PREEMPT["max_tokens"]
    assert any(r["record"]["recomputed"] for r in data["results"])
    check_records(data)


@pytest.mark.parametrize("scheduler", [ASYNC, SYNC])
def test_watermark_compacts_the_longest_mid_decode(session: dict[str, Any], scheduler: str) -> None:
    """Nothing is compacted after prefill (13 of 14 blocks: under the high watermark); when
    the pool is full the longest request is compacted with its decoded tokens, which frees
    enough (under the low watermark) that the other is not; both answers match their
    reference at every step (the compacted one the full cache's until the compaction), and
    every block comes back."""
    data = session[scheduler]["watermark"]
    settings = WATERMARK["compaction"]
    check_exact(data, {data["results"][0]["request"]}, budget=settings["budget"])
    (trace,) = [t for t in data["traces"] if t["side"] == "scheduler"]
    first = data["results"][0]
    assert trace["cached_tokens"] == first["prompt_tokens"] + 5  # its 5th token filled the pool
    assert trace["held_blocks"] == 8 and len(trace["kept_blocks"]) == 3
    assert trace["usage_after"] == pytest.approx(9 / 14)
    assert trace["usage_after"] < settings["low_watermark"]
    # the tokens decoded before the compaction saw the full cache, those after the compacted one
    steps = first["steps"]
    assert all(max_diff(s, "ref_full") < TOLERANCE for s in steps[:6])  # prefill + 5 tokens
    assert max(max_diff(s, "ref_full") for s in steps[6:]) > 100 * TOLERANCE
    assert first["record"]["cached_tokens"] == trace["cached_tokens"]
    assert "high watermark 95%" in session["log"]


def test_shared_blocks_are_gathered_into_fresh_ones(session: dict[str, Any]) -> None:
    """The first request gathers its kept tokens out of the blocks it shares into a fresh
    one; the second, then sole owner of those blocks, is compacted in place into them
    after the gather read them. Both answers match the compacted reference, every block
    comes back."""
    data = session[ASYNC]["gather"]
    check_exact(
        data, {r["request"] for r in data["results"]}, budget=GATHER["compaction"]["budget"]
    )
    first, second = [t for t in data["traces"] if t["side"] == "scheduler"]
    assert first["gathered"] and not second["gathered"]
    assert first["held_blocks"] == 8 and len(first["kept_blocks"]) == 1
    assert second["kept_blocks"][0] == first["released_blocks"][0]  # the formerly shared one
    assert "tokens gathered into fresh blocks" in session["log"]


def test_request_preempted_before_its_compaction_is_compacted_when_it_resumes(
    session: dict[str, Any],
) -> None:
    """Watermark trigger: a request preempted before the watermark could compact it keeps
    its window's queries and is compacted, with its decoded tokens, once it runs again on
    its recomputed cache; both answers match their reference at every step (full cache
    until each compaction) and every block comes back."""
    data = session[ASYNC]["preempted"]
    settings = PREEMPTED["compaction"]
    first, second = data["results"]
    check_exact(data, {first["request"], second["request"]}, budget=settings["budget"])
    assert "was not compacted yet; it can be compacted when it resumes" in session["log"]
    traces = [t for t in data["traces"] if t["side"] == "scheduler"]
    assert [t["request"] for t in traces] == [first["request"], second["request"]]
    for trace, result in zip(traces, (first, second), strict=True):
        assert trace["cached_tokens"] > result["prompt_tokens"]  # compacted mid-decode
        assert not trace["gathered"] and not result["record"]["recomputed"]
    assert all(len(r["tokens"]) == PREEMPTED["max_tokens"] for r in (first, second))
