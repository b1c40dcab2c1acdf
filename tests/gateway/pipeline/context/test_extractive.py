"""The extractive summarizer keeps the lines an agent needs later, without a model."""

from __future__ import annotations

from gateway.pipeline.context import extractive
from tests.gateway.pipeline.context.agent import session


def test_keeps_values_paths_identifiers_errors_and_the_calls_made():
    span = [
        {"role": "user", "content": "Fix the failing build."},
        {"role": "assistant", "content": "I decided to read the config first because it changed."},
        {"role": "tool", "tool_call_id": "c1", "content": "just some chatter\nport = 8443\n"},
        {"role": "tool", "tool_call_id": "c2", "content": "Traceback: KeyError in load_config"},
        {"role": "tool", "tool_call_id": "c3", "content": "edited gateway/http/app.py\nall fine"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c4", "function": {"name": "run_tests", "arguments": "{}"}}],
        },
    ]
    text = extractive.summarize(span, None, 2000)
    assert "Task:\n- Fix the failing build." in text
    assert "port = 8443" in text and "KeyError in load_config" in text
    assert "gateway/http/app.py" in text.split("Files touched:")[1]
    assert "run_tests({})" in text.split("DONE")[1]
    assert "decided to read the config" in text.split("Decisions:")[1]
    assert "just some chatter" not in text and "all fine" not in text


def test_folds_the_previous_summary_in_and_stays_under_its_size():
    previous = "Facts and values learned:\n- the api key is k-991"
    span = session(40)
    text = extractive.summarize(span, previous, 1500)
    assert len(text) <= 1500
    assert "k-991" in text
    # early and late values both survive when the lines do not all fit
    assert any(f"checksum {1000 + i}" in text for i in range(8)) and "checksum 1039" in text


def test_nothing_to_keep_gives_an_empty_summary():
    assert extractive.summarize([{"role": "assistant", "content": "ok"}], None, 500) == ""
