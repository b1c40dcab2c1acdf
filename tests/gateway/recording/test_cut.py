"""Cutting a chat answer's prompt token ids out of its bytes, unparsed."""

from __future__ import annotations

import orjson
import pytest

from gateway.recording.cut import as_written, cut_prompt_ids
from gateway.recording.records import RawJson


def test_the_array_is_cut_and_null_left_in_its_place():
    raw = b'{"id":"c","choices":[],"prompt_token_ids": [5, 6,7] ,"usage":{}}'
    rest, ids = cut_prompt_ids(raw)
    assert ids is not None and ids.data == b"[5, 6,7]" and ids.parsed() == [5, 6, 7]
    assert orjson.loads(rest) == {"id": "c", "choices": [], "prompt_token_ids": None, "usage": {}}


def test_an_empty_array_is_cut_too():
    rest, ids = cut_prompt_ids(b'{"prompt_token_ids":[]}')
    assert (
        ids is not None and ids.parsed() == [] and orjson.loads(rest) == {"prompt_token_ids": None}
    )


@pytest.mark.parametrize(
    "raw",
    [
        b'{"prompt_token_ids":null}',
        b'{"id":"c"}',
        b'{"prompt_token_ids":[[1,2],[3]]}',  # not integers only
        b'{"prompt_token_ids":["1"]}',
        b'{"prompt_token_ids":[1,2',  # cut short
        b'{"prompt_token_ids":',
    ],
)
def test_anything_else_is_left_for_the_parser(raw):
    assert cut_prompt_ids(raw) == (raw, None)


def test_the_key_inside_a_string_is_not_a_key():
    # A model that writes the key in its answer: inside a JSON string the quotes are escaped.
    data = {
        "choices": [{"message": {"content": '"prompt_token_ids":[1,2]'}}],
        "prompt_token_ids": [9],
    }
    rest, ids = cut_prompt_ids(orjson.dumps(data))
    assert ids is not None and ids.parsed() == [9]
    assert orjson.loads(rest)["choices"] == data["choices"]


def test_raw_json_is_written_back_as_it_came():
    assert orjson.dumps({"a": RawJson(b"[1,  2]")}, default=as_written) == b'{"a":[1,  2]}'
    with pytest.raises(TypeError):
        orjson.dumps({"a": object()}, default=as_written)
