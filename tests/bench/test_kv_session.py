"""bench.kv_session's session and arithmetic (its run on the real stack is
tests/e2e/test_kv_compaction.py::test_kv_session_quick)."""

from __future__ import annotations

from itertools import pairwise

from bench.kv_pressure import (
    Shape,
    agreement,
    read_counters,
    read_pool_blocks,
    session_messages,
    summarize,
)
from bench.kv_session import FACTS, compare, session_prompts


def test_the_session_grows_and_asks_where_the_facts_sit() -> None:
    prompts = session_prompts(4, 30)
    assert len(prompts) == 3 + 3  # one question a step, three at the last
    messages = [m for m, _, _ in prompts]
    # each step extends the last one's history
    history = [m.rsplit("\n\nQuestion:", 1)[0] for m in messages]
    assert all(b.startswith(a) for a, b in pairwise(history))
    assert [(v, w) for _, v, w in prompts[-3:]] == [
        (FACTS[0][1], "early"), (FACTS[1][1], "middle"), (FACTS[2][1], "late"),
    ]  # fmt: skip
    last = history[-1]
    notes = [last.index(f"NOTE: the {what} is {value}.") for what, value in FACTS]
    assert notes == sorted(notes) and notes[0] < len(last) / 4 and notes[2] > len(last) * 3 / 4
    assert [w for _, _, w in session_prompts(2, 24, 1)] == ["early", "early"]


def run(kept: list[int], correct: int, seconds: float) -> dict[str, object]:
    return {
        "kept_tokens": kept, "prompt_tokens": [700, 1300], "correct": correct, "steps": 2,
        "seconds_per_step": seconds, "peak_kv_usage": 0.1, "block_size": 128,
        "by_position": {"early": True},
    }  # fmt: skip


def test_compare() -> None:
    result = compare(run([700, 1300], 2, 10.0), run([700, 650], 1, 15.0))
    # blocks held: 6 + 11 off, 6 + 6 on
    assert result["concurrency_ratio"] == 17 / 12
    assert result["accuracy_vs_full_cache"] == 0.5 and result["time_ratio"] == 1.5
    assert compare(run([1], 0, 1.0), run([1], 0, 1.0))["accuracy_vs_full_cache"] is None


def test_pressure_sessions_do_not_share_a_prefix_and_ask_their_own_fact() -> None:
    sessions = [session_messages(k, 3, 12) for k in range(4)]
    firsts = [s[0][0] for s in sessions]
    assert len({m[:200] for m in firsts}) == 4  # different from the first line
    for k, steps in enumerate(sessions):
        history = [m.rsplit("\n\nQuestion:", 1)[0] for m, _ in steps]
        assert all(b.startswith(a) for a, b in pairwise(history))
        what, value = FACTS[k % len(FACTS)]
        assert {v for _, v in steps} == {f"{value}{k}"}
        assert f"NOTE: the {what} is {value}{k}." in steps[0][0]


METRICS = """\
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="full"} 3.0
# HELP gearshift_kv_compactions_total Requests compacted.
# TYPE gearshift_kv_compactions_total counter
gearshift_kv_compactions_total 2.0
# HELP gearshift_kv_compaction_freed_blocks_total Blocks freed.
# TYPE gearshift_kv_compaction_freed_blocks_total counter
gearshift_kv_compaction_freed_blocks_total 7.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",engine="0",num_gpu_blocks="24"} 1.0
"""


def test_counters_and_pool_from_metrics() -> None:
    assert read_counters(METRICS) == {
        "preemptions": 3.0, "compactions": 2.0, "evicted_tokens": 0.0, "freed_blocks": 7.0,
    }  # fmt: skip
    assert read_pool_blocks(METRICS) == 24 and read_pool_blocks("") is None


def pressure_round(compaction: str, answers: list[list[str]], seconds: float, cpu: float) -> dict:
    return {
        "compaction": compaction, "answers": answers, "seconds_per_step": seconds,
        "sessions_per_cpu_s": 2 / cpu, "right": sum(a == "7" for s in answers for a in s),
        "preemptions": 1.0, "compactions": 0.0 if compaction == "off" else 2.0,
        "freed_blocks": 0.0 if compaction == "off" else 5.0,
    }  # fmt: skip


def test_summarize_pressure_rounds() -> None:
    shape = Shape(sessions=2, steps=2, lines=12, pool_blocks=6, max_tokens=16,
                  trigger_tokens=256, budget="0.5")  # fmt: skip
    off = [["7", "7"], ["7", "7"]]
    rounds = [
        pressure_round("off", off, 10.0, 40.0),
        pressure_round("watermark", [["7", "7"], ["7", "8"]], 5.0, 20.0),
        pressure_round("off", off, 12.0, 40.0),
        pressure_round("watermark", off, 7.0, 20.0),
    ]
    result = summarize(rounds, shape)
    assert result["rounds"] == 2 and result["time_ratio"] == 6.0 / 11.0
    assert result["sessions_per_cpu_s_ratio"] == 2.0
    assert result["preemptions_off"] == 2.0 and result["compactions_on"] == 4.0
    assert result["accuracy_off"] == 1.0 and result["accuracy_on"] == 7 / 8
    assert result["answer_agreement"] == (3 / 4 + 1) / 2
    assert result["answer_agreement_off_rounds"] == 1.0
    assert summarize(rounds[:2], shape)["answer_agreement_off_rounds"] is None
    assert agreement(off, off) == 1.0
