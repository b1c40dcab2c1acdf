"""A masked tool output's placeholder: what was removed, how to get it back, and a
bounded digest of the lines an agent asks about later."""

from __future__ import annotations

from gateway.pipeline.context.masking import call_names, digest, masked, placeholder
from tests.gateway.pipeline.context.agent import step

LOG = "\n".join(
    [
        "$ pytest tests/test_orders.py",
        *(f"collected batch {i} in {i * 7} ms" for i in range(40)),
        "tests/test_orders.py::test_total FAILED",
        *(f"worker {i} idle for {i * 3} ms" for i in range(40)),
        "E   KeyError: 'currency'",
        "retry_budget = 17",
    ]
)


def test_the_digest_keeps_errors_values_and_paths_and_skips_bare_numbers():
    kept = digest(LOG, 400)
    assert "E   KeyError: 'currency'" in kept and "retry_budget = 17" in kept
    assert "tests/test_orders.py::test_total FAILED" in kept
    assert not any(line.startswith(("collected", "worker")) for line in kept)
    assert kept == sorted(kept, key=LOG.index)  # in the output's order


def test_the_digest_is_bounded_and_spread_over_the_output():
    values = "\n".join(f"key_{i} = {1000 + i}" for i in range(200))
    kept = digest(values, 200)
    assert sum(len(line) + 1 for line in kept) <= 200 and len(kept) > 3
    assert kept[0] == "key_0 = 1000" and kept[-1] == "key_199 = 1199"  # first and last
    assert digest(values, 0) == [] and digest("nothing worth keeping here\n" * 30, 200) == []


def test_the_placeholder_carries_the_digest_and_is_the_same_on_every_step():
    call, result = step(0, 100)
    result = {**result, "content": LOG}
    calls = call_names([call, result])
    text = placeholder(result, calls, 240)
    assert text.startswith("[run_shell output removed by the gateway to save context")
    assert "call the tool again" in text and "retry_budget = 17" in text
    assert len(text) < len(LOG) // 2
    assert masked(result, calls, 240) == masked(result, call_names([call, result]), 240)
    assert masked(result, calls, 240)["tool_call_id"] == result["tool_call_id"]
    plain = placeholder(result, calls, 0)  # no digest: only what was removed
    assert "retry_budget" not in plain and plain.endswith("call the tool again to see it.]")


def test_a_short_output_gets_a_digest_of_at_most_a_quarter_of_it():
    short = "port = 8080\n" + "x" * 300 + "\nhost_name = alpha\n" + "y" * 100
    text = placeholder({"role": "tool", "content": short}, {}, 1000)
    kept = text.split("]\n", 1)[1]
    assert len(kept) <= len(short) // 4 and "port = 8080" in kept
