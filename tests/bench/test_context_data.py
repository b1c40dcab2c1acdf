"""bench.context_data: the stored sessions are refused unless they match their manifest and
every question's answer is in the tool output it names; the question's text, its scoring
(bench.context_measure) and the mock upstream's reader for each kind of fact."""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from bench.context_data import KINDS, BadSessions, Question, load, manifest_path
from bench.context_measure import Score, score
from bench.context_sessions import VERSION, store
from bench.context_upstream import KIND_OF, QUESTION_RE, VALUES, answer


def record(value: str = "E4821", kind: str = "code", step: int = 0) -> dict[str, Any]:
    call = {
        "id": "call_0",
        "type": "function",
        "function": {"name": "run_shell", "arguments": '{"command": "python3 jobs/job_7.py"}'},
    }
    return {
        "id": "service-000",
        "family": "service",
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {
                "role": "tool",
                "tool_call_id": "call_0",
                "content": "RuntimeError: job_7 failed with E4821: db refused the connection",
            },
        ],
        "questions": [{"key": "job_7", "kind": kind, "value": value, "step": step, "end": False}],
    }


def write(tmp_path: Path, *records: dict[str, Any]) -> Path:
    out = tmp_path / "s.jsonl.gz"
    store([orjson.dumps(r, option=orjson.OPT_SORT_KEYS) + b"\n" for r in records], out, {})
    return out


def test_load_reads_a_stored_session_with_its_questions(tmp_path: Path) -> None:
    [s] = load(write(tmp_path, record()), VERSION)
    assert (s.id, s.family, len(s.messages)) == ("service-000", "service", 4)
    assert s.questions == [Question("job_7", "code", "E4821", end=False)]
    text = s.questions[0].text()
    assert text == (
        "QUESTION: earlier in this conversation, a tool's output printed a line with job_7 "
        "and its error code. Without calling any tool, reply with that error code only (the "
        "letter E and four digits), copied exactly from that line."
    )


@pytest.mark.parametrize("kind", KINDS)
def test_each_question_is_read_back_by_the_mock_and_holds_no_value_of_its_own(kind: str) -> None:
    """The mock's oracle reads the kind and the key back from the wording (#24's recall
    question), and the wording has no value of any kind in it: a fact the history lost
    is answered ``unknown``, never a number or a code read off the question."""
    text = Question("job_7", kind, "").text()
    m = QUESTION_RE.search(orjson.dumps({"content": text}))
    assert m is not None and (KIND_OF[m.group(2)], m.group(1)) == (kind.encode(), b"job_7")
    assert not any(re.search(v, text.encode()) for v in VALUES.values())
    body = {"model": "m", "messages": [{"role": "user", "content": f"job_7 {text}"}]}
    assert orjson.loads(answer(orjson.dumps(body)))["choices"][0]["message"]["content"] == "unknown"


@pytest.mark.parametrize(
    ("spoil", "message"),
    [
        (lambda p: p.write_bytes(gzip.compress(gzip.decompress(p.read_bytes()) + b" ")), "sha256"),
        (lambda p: manifest_path(p).unlink(), "cannot read"),
        (lambda p: p.write_bytes(b"not gzip"), "cannot read"),
    ],
)
def test_load_refuses_a_file_that_does_not_match_its_manifest(
    tmp_path: Path, spoil: Any, message: str
) -> None:
    path = write(tmp_path, record())
    spoil(path)
    with pytest.raises(BadSessions, match=message):
        load(path)


def test_load_refuses_another_generator_version(tmp_path: Path) -> None:
    with pytest.raises(BadSessions, match="regenerate"):
        load(write(tmp_path, record()), VERSION + 1)


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        (record(value="E9999"), "not in tool output 0"),  # the answer is not where it says
        (record(step=3), "not in tool output 3"),
        (record(kind="colour"), "kind 'colour'"),
        ({**record(), "questions": []}, "no questions"),
        ({k: v for k, v in record().items() if k != "family"}, "not a session record"),
    ],
)
def test_load_refuses_a_record_whose_questions_cannot_be_checked(
    tmp_path: Path, bad: dict[str, Any], message: str
) -> None:
    with pytest.raises(BadSessions, match=message):
        load(write(tmp_path, record(), bad))


@pytest.mark.parametrize(
    ("kind", "value", "reply", "expected"),
    [
        ("code", "E4821", "E4821", Score(exact=True, normalised=True)),
        ("code", "E4821", "The job failed with E4821.", Score(exact=False, normalised=True)),
        ("code", "E4821", "exit status 1, then E4821", Score(exact=False, normalised=True)),
        ("code", "E4821", "E1234 or E4821", Score(exact=False, normalised=False)),
        (
            "file",
            "dist/b_2-3fa9c1.tar",
            "`dist/b_2-3fa9c1.tar`",
            Score(exact=True, normalised=True),
        ),
        (
            "file",
            "dist/b_2-3fa9c1.tar",
            "It is dist/b_2-3fa9c1.tar (512 bytes)",
            Score(exact=False, normalised=True),
        ),
        ("file", "dist/b_2-3fa9c1.tar", "b_2-3fa9c1.tar", Score(exact=False, normalised=False)),
    ],
)
def test_score_reads_codes_and_paths(kind: str, value: str, reply: str, expected: Score) -> None:
    assert score(reply, value, kind) == expected


@pytest.mark.parametrize(
    ("line", "question", "expected"),
    [
        (
            "RuntimeError: job_7 failed with E4821: db refused",
            Question("job_7", "code", ""),
            "E4821",
        ),
        (
            "packed bundle_2 into dist/bundle_2-3fa9c1.tar (512 bytes)",
            Question("bundle_2", "file", ""),
            "dist/bundle_2-3fa9c1.tar",
        ),
        ("orders_3: rows=41 total=53120 mean=1295.6", Question("orders_3", "number", ""), "53120"),
        ("check_result = 48213", Question("job_7", "code", ""), "unknown"),
    ],
)
def test_the_mock_reader_finds_each_kind_after_its_key(
    line: str, question: Question, expected: str
) -> None:
    body = {
        "model": "m",
        "messages": [
            {"role": "tool", "content": f"starting\n{line}\n"},
            {"role": "user", "content": question.text()},
        ],
    }
    reply = orjson.loads(answer(orjson.dumps(body)))
    assert reply["choices"][0]["message"]["content"] == expected
