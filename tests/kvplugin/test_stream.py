"""kvplugin.stream: the record chunk a compacted stream gains before ``[DONE]``.

The wrapper is applied here to stand-ins with the parameter names of vLLM 0.32's stream
generators (the gateway's environment has no vLLM); tests/kvplugin/test_plugin_load.py
checks that the real ones are wrapped, tests/e2e/test_kv_compaction.py the real stream.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest

from kvplugin.stream import DONE, with_record_chunk

RECORD = {"prompt_tokens": 40, "kept_tokens": 20, "freed_blocks": 1, "seconds": 0.1,
          "recomputed": False, "evicted_tokens": 20}  # fmt: skip
COMPACTED = {"gearshift_kv_compaction": RECORD}


def output(finished: bool, params: dict[str, Any] | None = None) -> SimpleNamespace:
    return SimpleNamespace(finished=finished, kv_transfer_params=params)


async def outputs(*items: Any) -> AsyncIterator[Any]:
    for item in items:
        yield item


class Serving:
    """vLLM's chat stream generator, reduced to its shape: one event per output, [DONE]."""

    closed = False

    async def chat_completion_stream_generator(
        self, request: object, result_generator: AsyncIterator[Any], request_id: str,
        model_name: str, conversation: list[Any], *, chat_template_kwargs: Any = None,
    ) -> AsyncIterator[str]:  # fmt: skip
        try:
            async for res in result_generator:
                yield f"data: {json.dumps({'created': 1700, 'finished': res.finished})}\n\n"
            yield DONE
        finally:
            self.closed = True

    async def completion_stream_generator(
        self, request: object, engine_inputs: list[Any], result_generator: AsyncIterator[Any],
        request_id: str, created_time: int, model_name: str, num_prompts: int,
    ) -> AsyncIterator[str]:  # fmt: skip
        async for _index, _res in result_generator:
            yield "data: {}\n\n"
        yield DONE


def collect(stream: AsyncIterator[str]) -> list[str]:
    async def run() -> list[str]:
        return [event async for event in stream]

    return asyncio.run(run())


def chat(*items: Any) -> list[str]:
    wrapped = with_record_chunk(
        Serving.chat_completion_stream_generator, "chat.completion.chunk", indexed=False
    )
    return collect(wrapped(Serving(), None, outputs(*items), "chatcmpl-9", "m", [],
                           chat_template_kwargs={}))  # fmt: skip


def test_a_compacted_chat_stream_gains_the_record_chunk_before_done():
    events = chat(output(False), output(True, COMPACTED))
    assert [json.loads(e.removeprefix("data: "))["finished"] for e in events[:2]] == [False, True]
    assert events[-1] == DONE and len(events) == 4
    chunk = json.loads(events[2].removeprefix("data: "))
    assert chunk["kv_transfer_params"] == COMPACTED and chunk["choices"] == []
    assert (chunk["id"], chunk["object"], chunk["model"]) == (
        "chatcmpl-9",
        "chat.completion.chunk",
        "m",
    )
    assert chunk["created"] == 1700  # the stream's, as its other chunks say


def test_a_stream_without_a_record_is_left_as_it_was():
    assert chat(output(False), output(True, None)) == chat(output(False), output(True, {"x": 1}))
    assert len(chat(output(True))) == 2


def test_completions_take_the_first_prompts_record_and_its_creation_time():
    wrapped = with_record_chunk(
        Serving.completion_stream_generator, "text_completion", indexed=True
    )
    events = collect(
        wrapped(Serving(), None, [], outputs((1, output(True, {"gearshift_kv_compaction": {}})),
                (0, output(True, COMPACTED))), "cmpl-3", 1234, "m", num_prompts=2)
    )  # fmt: skip
    chunk = json.loads(events[-2].removeprefix("data: "))
    assert chunk["kv_transfer_params"] == COMPACTED
    assert (chunk["object"], chunk["created"]) == ("text_completion", 1234)


def test_closing_the_wrapped_stream_closes_vllms_generator_at_once():
    serving = Serving()
    wrapped = with_record_chunk(
        Serving.chat_completion_stream_generator, "chat.completion.chunk", indexed=False
    )

    async def leave_after_one() -> None:
        stream = wrapped(serving, None, outputs(output(False), output(True)), "c", "m", [])
        await anext(stream)  # type: ignore[call-overload]
        await stream.aclose()  # type: ignore[attr-defined]

    asyncio.run(leave_after_one())
    assert serving.closed


def test_a_generator_without_the_expected_parameters_is_refused():
    async def other(self: object, results: AsyncIterator[Any]) -> AsyncIterator[str]:
        yield DONE

    with pytest.raises(TypeError, match="request_id"):
        with_record_chunk(other, "chat.completion.chunk", indexed=False)
