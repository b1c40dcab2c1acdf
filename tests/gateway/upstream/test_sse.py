from __future__ import annotations

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
