"""The extractive summarizer keeps the lines an agent needs later, without a model."""

from __future__ import annotations

import json

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


def tool(i: int, text: str) -> dict[str, str]:
    return {"role": "tool", "tool_call_id": f"c{i}", "content": text}


def log_spam(service: str, count: int, start: int = 0) -> str:
    return "\n".join(
        f"12-01T10:{i % 60:02d} INFO [{service}] handled {100 + i} requests in {i + 3} ms"
        for i in range(start, start + count)
    )


def test_scores_errors_named_values_totals_and_new_values_above_plain_numbers():
    plain = extractive.score("served 12 requests", first=False, last=False, repeats=0, novel=0)
    for line in ("RuntimeError: job failed", "limit = 12", "12 lines in total"):
        assert extractive.score(line, first=False, last=False, repeats=0, novel=0) > plain
    assert extractive.score("served 12 requests", first=False, last=False, repeats=0, novel=2) > (
        plain
    )
    # the first and the last line of an output count; a repeated shape (log spam) counts less
    assert extractive.score("served 12 requests", first=True, last=False, repeats=0, novel=0) > (
        plain
    )
    assert extractive.score("served 12 requests", first=False, last=False, repeats=3, novel=0) < (
        plain
    )
    # what new tokens add is capped: a line of many values is not worth many lines
    many = extractive.score("a 1", first=False, last=False, repeats=0, novel=50)
    assert many == extractive.score("a 1", first=False, last=False, repeats=0, novel=3)


def test_rank_counts_first_occurrences_rare_tokens_and_repeated_shapes():
    ranked = extractive.rank(
        [(1, ["build 7 queued", "cache at 88 percent"]), (2, ["build 7 queued again", "x 5 y"])]
    )
    score = {c.text: c.score for c in ranked}
    # "7" was printed before, and by two outputs: worth less the second time
    assert score["build 7 queued"] > score["build 7 queued again"]
    shaped = extractive.rank([(1, ["head 0", "req 1 ok", "req 2 ok", "req 3 ok", "tail 9"])])
    got = [c.score for c in shaped]
    assert got[1] > got[2] > got[3]  # the same shape, each time less
    assert got[0] > got[2] and got[4] > got[2]  # the first and the last line of the output


def test_each_tool_output_keeps_its_best_line_before_any_keeps_a_second():
    span = [{"role": "user", "content": "Find the failing job."}]
    span.append(tool(0, log_spam("db", 40) + "\nRuntimeError: job_7 failed with E4821"))
    span += [tool(i, log_spam(f"svc{i}", 30, 40 * i)) for i in range(1, 12)]
    span.append(tool(12, "orders_3: rows=120 total=53120\n" + log_spam("api", 30, 500)))
    text = extractive.summarize(span, None, 1600)
    assert len(text) <= 1600
    assert "RuntimeError: job_7 failed with E4821" in text
    assert "orders_3: rows=120 total=53120" in text
    facts = text.split("Facts and values learned:\n")[1].split("Files touched:")[0]
    # every output has a line among the facts, none more than a few: the room is spread
    assert all(f"[svc{i}]" in facts for i in range(1, 12))
    assert max(facts.count(f"[svc{i}]") for i in range(1, 12)) <= 3


def test_near_identical_lines_give_way_to_what_is_new():
    spam = "\n".join(f"GET /health 200 in {i} ms" for i in range(200))
    span = [tool(0, spam[:3000] + "\nwrote out/run_4/build-99731.tar\n" + spam[3000:])]
    text = extractive.summarize(span, None, 300)  # room for a few lines of the 201
    facts = text.split("Facts and values learned:\n")[1].split("Files touched:")[0]
    assert "wrote out/run_4/build-99731.tar" in facts
    assert 0 < facts.count("GET /health") < 10


def test_a_json_file_read_is_its_lines_not_one_blob():
    content = "def merge(rows, limit=19):\n    return rows\n" + "# filler line\n" * 100
    content += "MAX_RETRIES = 52173\n"
    span = [tool(0, json.dumps({"content": content})[:2500])]
    text = extractive.summarize(span, None, 800)
    assert "MAX_RETRIES = 52173" in text and "def merge(rows, limit=19):" in text
    assert not [ln for ln in text.splitlines() if len(ln) > extractive.LINE_CHARS + 2]


def test_the_previous_summary_keeps_at_most_half_the_facts_room():
    previous = "Facts and values learned:\n" + "\n".join(
        f"- old value v{i} = {i}" for i in range(80)
    )
    span = [tool(i, f"RuntimeError: job_{i} failed with E{4000 + i}") for i in range(6)]
    text = extractive.summarize(span, previous, 1200)
    assert len(text) <= 1200
    assert "old value v0 = 0" in text  # the earlier summary first
    assert all(f"E{4000 + i}" in text for i in range(6))  # and room left for the new facts
    # an earlier version's "Other values" heading folds into the facts
    other = extractive.summarize([], "Other values:\n- retries 7", 400)
    assert "Facts and values learned:\n- retries 7" in other


def test_spread_order_takes_the_ends_then_points_between():
    assert extractive.spread_order([]) == []
    assert extractive.spread_order(["a"]) == ["a"]
    assert extractive.spread_order(list(range(9)))[:4] == [0, 8, 3, 5]
    assert sorted(extractive.spread_order(list(range(9)))) == list(range(9))


def test_pick_stays_within_the_room():
    ranked = extractive.rank([(i, [f"value_{i} = {i}" * 3]) for i in range(30)])
    for room in (0, 10, 100, 500):
        kept = extractive.pick(ranked, room)
        assert sum(len(x) + 3 for x in kept) <= room
    assert extractive.pick(ranked, 0) == []
