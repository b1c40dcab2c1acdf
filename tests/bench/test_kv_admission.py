"""bench.kv_admission's prompts, gauges and arithmetic (no stack)."""

from __future__ import annotations

from bench.kv_admission import GaugeSampler, burst_prompt, read_gauges, summarize
from bench.kv_pressure import Shape
from bench.kv_session import FACTS

GAUGES = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="full"} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="full"} 2.0
"""


def test_burst_prompts_are_their_own_and_ask_their_own_fact() -> None:
    prompts = [burst_prompt(k, 20) for k in range(4)]
    assert len({m[:200] for m, _ in prompts}) == 4  # no shared prefix
    for k, (message, value) in enumerate(prompts):
        what, base = FACTS[k % len(FACTS)]
        assert value == f"{base}{k}"
        note = message.index(f"NOTE: the {what} is {value}.")
        assert len(message) / 4 < note < len(message) * 3 / 4  # in the middle
        assert message.endswith(f"what is the {what}? Answer with the number only.")


def test_gauges_from_metrics_and_their_peak_and_mean() -> None:
    assert read_gauges(GAUGES) == {"running": 3.0, "waiting": 2.0}
    assert read_gauges("") == {"running": 0.0, "waiting": 0.0}
    sampler = GaugeSampler("http://127.0.0.1:9")  # never started: samples set by hand
    sampler.samples = [{"running": 2.0, "waiting": 3.0}, {"running": 4.0, "waiting": 1.0}]
    assert sampler.stats() == {
        "peak_running": 4.0, "mean_running": 3.0, "peak_waiting": 3.0, "mean_waiting": 2.0,
    }  # fmt: skip


def burst_round(compaction: str, peak: float, answers: list[str], wall: float) -> dict:
    return {
        "compaction": compaction, "answers": answers, "peak_running": peak,
        "mean_running": peak / 2, "peak_waiting": 5 - peak, "time_to_last_token_max_s": wall,
        "decoded_tokens_per_s": 400 / wall, "requests_per_cpu_s": 4 / (2 * wall),
        "right": sum(a == "7" for a in answers), "preemptions": 0.0,
        "compactions": 0.0 if compaction == "off" else 4.0,
        "freed_blocks": 0.0 if compaction == "off" else 20.0,
    }  # fmt: skip


def test_summarize_burst_rounds() -> None:
    shape = Shape(sessions=4, steps=1, lines=40, pool_blocks=26, max_tokens=100,
                  trigger_tokens=512, budget="0.5")  # fmt: skip
    rounds = [
        burst_round("off", 2.0, ["7", "7", "7", "7"], 100.0),
        burst_round("prompt", 4.0, ["7", "7", "7", "8"], 50.0),
    ]
    result = summarize(rounds, shape)
    assert result["concurrency_ratio"] == 2.0 and result["mean_running_ratio"] == 2.0
    assert result["decode_speedup"] == 2.0 and result["time_to_last_token_ratio"] == 0.5
    assert result["requests_per_cpu_s_ratio"] == 2.0
    assert result["accuracy_vs_full_cache"] == 0.75 and result["answer_agreement"] == 0.75
    assert result["compactions_on"] == 4.0 and result["freed_blocks_on"] == 20.0
    none_right = [burst_round("off", 2.0, ["0"] * 4, 100.0), rounds[1]]
    assert summarize(none_right, shape)["accuracy_vs_full_cache"] is None
