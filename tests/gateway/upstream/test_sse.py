from __future__ import annotations

import random

import orjson

from gateway.errors import UpstreamTimeout
from gateway.upstream.sse import DONE, error_event, split_events


def test_split_keeps_the_incomplete_tail():
    events, rest = split_events(b"data: 1\n\ndata: 2\n\ndata: 3")
    assert events == [b"data: 1\n\n", b"data: 2\n\n"] and rest == b"data: 3"
    assert split_events(b"") == ([], b"")


def test_error_event_has_openai_shape_then_done():
    raw = error_event(UpstreamTimeout("slow"))
    first, done = raw.split(b"\n\n", 1)
    assert orjson.loads(first[len(b"data: ") :]) == {
        "error": {"message": "slow", "type": "timeout", "param": None, "code": "upstream_timeout"}
    }
    assert done == DONE


def _split_two_byte(buf: bytes) -> tuple[list[bytes], bytes]:
    """The obvious split, by the two-byte search, for reference."""
    events, start = [], 0
    while (end := buf.find(b"\n\n", start)) >= 0:
        events.append(buf[start : end + 2])
        start = end + 2
    return events, buf[start:]


def test_split_matches_the_two_byte_search_with_lone_and_tripled_line_breaks():
    rng = random.Random(7)
    cases = [
        b"a\nb\n\n",
        b"\n",
        b"\n\n",
        b"\n\n\n",
        b"x\n\n\ny\n",
        b"data: 1\n",
        b"a\n\nb\nc\n\n\n\nd",
    ]
    cases += [bytes(rng.choice(b"ab\n") for _ in range(rng.randrange(40))) for _ in range(500)]
    for buf in cases:
        assert split_events(buf) == _split_two_byte(buf), buf


def test_split_a_recorded_first_event_of_tens_of_kilobytes():
    ids = b",".join(b"%d" % i for i in range(10_000))
    first = b'data: {"choices":[],"prompt_token_ids":[' + ids + b"]}\n\n"
    events, rest = split_events(first + b"data: [DONE]\n\ndata: {")
    assert events == [first, DONE] and rest == b"data: {"
