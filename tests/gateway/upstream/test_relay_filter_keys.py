"""``relay_filter.Keys``: the filter's key search skips a prompt's token ids and finds
exactly what a search of the whole event finds."""

from __future__ import annotations

import itertools

import orjson

from gateway.upstream.relay_filter import (
    EMPTY_CHOICES,
    FINGERPRINT_MARK,
    FINISH_MARK,
    KV_MARK,
    USAGE_MARK,
    EventFilter,
    Keys,
)
from gateway.upstream.sse import DONE

MARKS = (USAGE_MARK, EMPTY_CHOICES, KV_MARK, FINISH_MARK, FINGERPRINT_MARK)
IDS = b",".join(b"%d" % i for i in range(2000))


def events() -> list[bytes]:
    """Events with the marks before, after and (as text or keys) inside a prompt-id array."""
    parts = [
        b'"choices":[]', b'"usage":{"prompt_tokens":1}', b'"finish_reason":"stop"',
        b'"system_fingerprint":"fp"', b'"kv_transfer_params":{"a":1}', b'"x":1',
    ]  # fmt: skip
    arrays = [
        b"[" + IDS + b"]",
        b"[" + IDS + b',"usage":{]',  # not JSON, but a quote: searched whole
        b'["finish_reason":"' + IDS + b"]",
        b"[[1,2],[" + IDS + b'],{"usage":{}}]',  # nested: the rest is searched
        b"[" + IDS,  # never closed
        b"null",
    ]
    out = []
    for before, after in itertools.product(parts, repeat=2):
        for array in arrays:
            out.append(b'data: {"id":"c",' + before + b',"prompt_token_ids":' + array
                       + b"," + after + b"}\n\n")  # fmt: skip
    return out


def test_keys_finds_what_a_whole_search_finds():
    for ev in events():
        keys = Keys(ev)
        for mark in MARKS:
            assert (mark in keys) == (mark in ev), (mark, ev[:80], ev[-80:])


def test_a_long_first_event_that_finishes_is_held_for_the_usage_chunk():
    """A one-token answer: its first event carries the prompt's ids and the finish."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    choice = {"index": 0, "delta": {"role": "assistant", "content": "x"}, "logprobs": None,
              "finish_reason": "length"}  # fmt: skip
    first = b"data: " + orjson.dumps({**head, "choices": [choice]})[:-1]
    first += b',"prompt_token_ids":[' + IDS + b"]}\n\n"
    usage = {**head, "choices": [], "usage": {"prompt_tokens": 2000, "completion_tokens": 1},
             "system_fingerprint": "fp"}  # fmt: skip
    f = EventFilter(strip_usage=True)
    assert f([first]) == b""  # held until the usage chunk's fingerprint
    out = f([b"data: " + orjson.dumps(usage) + b"\n\n", DONE])
    assert out.startswith(b"data: " + orjson.dumps({**head, "choices": [choice]})[:-1])
    assert out.endswith(b"]}\n\n" + DONE) and b'"system_fingerprint":"fp"' in out
    assert f.usage["prompt_tokens"] == 2000
