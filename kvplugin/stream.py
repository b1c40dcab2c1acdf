"""A compacted request's record in a streamed answer: one more chunk before ``[DONE]``.

vLLM 0.32 copies a finished request's ``kv_transfer_params`` (where ``kvplugin.metrics``
puts the compaction record) into non-streamed answers only: its stream generators receive
the same finished output and drop the field. In vLLM's API-server process the plugin wraps
both stream generators (chat and completions): it watches the outputs they read and, when
the finished one carries a record, sends one more chunk just before ``data: [DONE]``::

    data: {"id": ..., "object": ..., "created": ..., "model": ...,
           "choices": [], "kv_transfer_params": {"gearshift_kv_compaction": {...}}}

shaped as the usage chunk is (no choices), so OpenAI clients talking to vLLM directly pass
over it. Gearshift's gateway reads it and strips it (``gateway.upstream.relay_filter``).
A stream without a compacted request is left byte for byte as vLLM wrote it.

Pure Python: vLLM is imported only by ``install_stream_hooks``.
"""

from __future__ import annotations

import inspect
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

from kvplugin.metrics import record_of

DONE = "data: [DONE]\n\n"
# the stream's creation time, at the top of its first chunk (a string value holds `"` escaped)
CREATED = re.compile(r'"created":\s*(\d+)')
# (module, class, method, chunk object, whether its outputs come as (prompt index, output))
STREAM_GENERATORS = (
    ("vllm.entrypoints.openai.chat_completion.serving", "OpenAIServingChat",
     "chat_completion_stream_generator", "chat.completion.chunk", False),
    ("vllm.entrypoints.openai.completion.serving", "OpenAIServingCompletion",
     "completion_stream_generator", "text_completion", True),
)  # fmt: skip


class _Watch:
    """Passes a request's outputs through and keeps the record of its finished output
    (of the first prompt's, for a batch of completion prompts, as the whole answer does)."""

    def __init__(self, indexed: bool) -> None:
        self.indexed = indexed
        self.record: dict[str, Any] | None = None

    async def outputs(self, source: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async with aclosing(source):  # type: ignore[type-var]
            async for item in source:
                index, output = item if self.indexed else (0, item)
                if index == 0 and getattr(output, "finished", False):
                    self.record = record_of(getattr(output, "kv_transfer_params", None))
                yield item


def record_chunk(
    arguments: dict[str, Any], chunk_object: str, record: dict[str, Any], created: int | None
) -> str:
    """The extra event: the stream's id, model and creation time (``created``: its chunks',
    read from the first; vLLM's chat generator takes none), no choices, the record."""
    chunk: dict[str, Any] = {
        "id": arguments.get("request_id"),
        "object": chunk_object,
        "created": arguments.get("created_time") or created or int(time.time()),
        "model": arguments.get("model_name"),
        "choices": [],
        "kv_transfer_params": {"gearshift_kv_compaction": record},
    }
    return f"data: {json.dumps(chunk, separators=(',', ':'))}\n\n"


def with_record_chunk(
    generator: Callable[..., AsyncIterator[str]], chunk_object: str, indexed: bool
) -> Callable[..., AsyncIterator[str]]:
    """``generator`` (a vLLM stream generator method taking ``result_generator``), sending
    the record chunk before ``[DONE]`` when the request was compacted."""
    signature = inspect.signature(generator)
    missing = {"result_generator", "request_id", "model_name"} - set(signature.parameters)
    if missing:  # another vLLM than 0.32: refuse to load rather than break every stream
        raise TypeError(f"{generator.__qualname__} takes no {sorted(missing)}")

    async def stream(*args: Any, **kwargs: Any) -> AsyncIterator[str]:
        bound = signature.bind(*args, **kwargs)
        watch = _Watch(indexed)
        bound.arguments["result_generator"] = watch.outputs(bound.arguments["result_generator"])
        # closed at once when the client goes away, so vLLM aborts the request as before
        created: int | None = None
        async with aclosing(generator(*bound.args, **bound.kwargs)) as events:  # type: ignore[type-var]
            async for event in events:
                if created is None and (found := CREATED.search(event)):
                    created = int(found.group(1))
                if event == DONE and watch.record is not None:
                    yield record_chunk(bound.arguments, chunk_object, watch.record, created)
                yield event

    stream._gearshift_kv = True  # type: ignore[attr-defined]
    return stream


def install_stream_hooks() -> None:
    """Wrap vLLM's chat and completion stream generators (once; harmless in processes that
    serve no HTTP)."""
    import importlib

    for module_name, class_name, method, chunk_object, indexed in STREAM_GENERATORS:
        cls = getattr(importlib.import_module(module_name), class_name)
        original = getattr(cls, method)
        if not getattr(original, "_gearshift_kv", False):
            setattr(cls, method, with_record_chunk(original, chunk_object, indexed))
