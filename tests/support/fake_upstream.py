"""A fault-injecting stand-in for a vLLM replica.

It speaks just enough of vLLM's OpenAI API (chat and completions, stream and
not, usage chunk, /health) for the gateway's failure handling to be tested:
each request takes the next scripted behaviour, or ``ok`` when the script is
empty. It records what it received and whether the gateway hung up on it.
It is a fault injector for the gateway's own tests, never a substitute for
vLLM in the end-to-end tests.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Behaviour:
    kind: str = "ok"  # ok | status | stall | cut | stall_mid
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    body: dict[str, Any] | None = None
    delay_s: float = 0.0  # before the answer (first byte)
    events: int = 5  # streamed content events
    after: int = 2  # cut/stall after this many content events (-1: before any event)
    message: dict[str, Any] | None = None  # the assistant message to answer with (non-stream)
    # kvplugin's record (compacted): a stream's record chunk, a whole answer's kv_transfer_params
    kv_record: dict[str, Any] | None = None


def ok() -> Behaviour:
    return Behaviour()


def status(code: int, headers: dict[str, str] | None = None, message: str = "boom") -> Behaviour:
    body = {"error": {"message": message, "type": "server_error", "param": None, "code": code}}
    return Behaviour("status", status=code, headers=headers or {}, body=body)


class FakeUpstream:
    def __init__(self, name: str = "fake") -> None:
        self.name = name
        self.script: deque[Behaviour] = deque()
        self.requests: list[dict[str, Any]] = []
        self.disconnects = 0  # requests the gateway abandoned mid-answer
        self.healthy = True
        self.vocab_shift = 0  # /tokenize: change to act as another tokenizer
        self.template = "<chat>{}</chat>"  # /tokenize: change to act as another chat template
        self.health_checks = 0
        self._lock = threading.Lock()
        self.app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._complete, methods=["POST"]),
                Route("/v1/completions", self._complete, methods=["POST"]),
                Route("/health", self._health, methods=["GET"]),
                Route("/tokenize", self._tokenize, methods=["POST"]),
            ]
        )

    def then(self, *behaviours: Behaviour) -> FakeUpstream:
        self.script.extend(behaviours)
        return self

    async def _tokenize(self, request: Request) -> Response:
        """A stand-in tokenizer: code points, shifted by ``vocab_shift``; a chat is rendered
        by ``template`` (a format string over the messages' JSON) first."""
        body = orjson.loads(await request.body())
        if "messages" in body:
            text = self.template.format(orjson.dumps(body["messages"]).decode())
        else:
            text = body["prompt"]
        tokens = [ord(c) + self.vocab_shift for c in text]
        return Response(
            orjson.dumps({"tokens": tokens, "count": len(tokens)}), media_type="application/json"
        )

    async def _health(self, request: Request) -> Response:
        self.health_checks += 1
        return Response(status_code=200 if self.healthy else 503)

    async def _complete(self, request: Request) -> Response:
        body = orjson.loads(await request.body())
        with self._lock:
            self.requests.append(body)
            b = self.script.popleft() if self.script else ok()
        if (b.delay_s or b.kind == "stall") and await self._gone_during(
            request, 60.0 if b.kind == "stall" else b.delay_s
        ):
            self.disconnects += 1  # as vLLM does, notice the hang-up and stop working
            return Response(status_code=499)
        if b.kind == "status":
            return Response(
                orjson.dumps(b.body), b.status, b.headers, media_type="application/json"
            )
        if body.get("stream"):
            return StreamingResponse(self._events(body, b), media_type="text/event-stream")
        return Response(orjson.dumps(self._completion(body, b)), media_type="application/json")

    @staticmethod
    async def _gone_during(request: Request, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if await request.is_disconnected():
                return True
            await asyncio.sleep(0.01)
        return False

    def _completion(self, body: dict[str, Any], b: Behaviour) -> dict[str, Any]:
        """Like vLLM: token ids with ``return_token_ids``, the sampled tokens' logprobs with
        ``logprobs``. Choice i's tokens are 100*(i+1) + k and token k's logprob is -k/10."""
        n = body.get("n") or 1
        data: dict[str, Any] = {
            "id": "cmpl-fake",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body["model"],
            "choices": [
                {
                    "index": i,
                    "message": b.message
                    or {"role": "assistant", "content": f"hello from {self.name}"},
                    "finish_reason": "tool_calls"
                    if b.message and b.message.get("tool_calls")
                    else "stop",
                    "logprobs": fake_logprobs(4) if body.get("logprobs") else None,
                    # like vLLM, the keys are there either way (null when not asked for)
                    "token_ids": fake_ids(i, 4) if body.get("return_token_ids") else None,
                }
                for i in range(n)
            ],
            "usage": {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11},
        }
        data["prompt_token_ids"] = list(range(1, 8)) if body.get("return_token_ids") else None
        if b.kv_record is not None:
            data["kv_transfer_params"] = {"gearshift_kv_compaction": b.kv_record}
        return data

    def _chunk(
        self, body: dict[str, Any], delta: dict[str, Any], finish: str | None = None, k: int = -1
    ) -> bytes:
        """Content chunk k carries two tokens (as speculative decoding does): 2k and 2k+1."""
        choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        chunk: dict[str, Any] = {
            "id": "chunk-fake",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": body["model"],
            "choices": [choice],
        }
        if k >= 0 and body.get("return_token_ids"):
            choice["token_ids"] = [100 + 2 * k, 101 + 2 * k]
        if k >= 0 and body.get("logprobs"):
            choice["logprobs"] = {
                "content": [
                    {"token": "t", "logprob": -(2 * k + j) / 10, "bytes": [116], "top_logprobs": []}
                    for j in range(2)
                ]
            }
        if k < 0 and body.get("return_token_ids"):
            chunk["prompt_token_ids"] = list(range(1, 8))
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    async def _events(self, body: dict[str, Any], b: Behaviour) -> AsyncIterator[bytes]:
        try:
            if b.kind == "cut" and b.after < 0:
                raise ConnectionAbortedError("scripted cut before the first event")
            yield self._chunk(body, {"role": "assistant", "content": ""})
            for i in range(b.events):
                if i == b.after and b.kind == "cut":
                    raise ConnectionAbortedError("scripted cut")  # uvicorn drops the connection
                if i == b.after and b.kind == "stall_mid":
                    await asyncio.sleep(60)
                yield self._chunk(
                    body, {"content": f"tok{i} "}, "stop" if i == b.events - 1 else None, k=i
                )
                await asyncio.sleep(0)
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {
                    "prompt_tokens": 7,
                    "completion_tokens": b.events,
                    "total_tokens": 7 + b.events,
                }
                yield (
                    b"data: "
                    + orjson.dumps(
                        {
                            "id": "chunk-fake",
                            "object": "chat.completion.chunk",
                            "created": 0,
                            "model": body["model"],
                            "choices": [],
                            "usage": usage,
                        }
                    )
                    + b"\n\n"
                )
            if b.kv_record is not None:  # as kvplugin/stream.py sends it
                params = {"gearshift_kv_compaction": b.kv_record}
                chunk = {"id": "chunk-fake", "choices": [], "kv_transfer_params": params}
                yield b"data: " + orjson.dumps(chunk) + b"\n\n"
            yield b"data: [DONE]\n\n"
        except (asyncio.CancelledError, GeneratorExit):
            self.disconnects += 1
            raise


def fake_ids(choice: int, count: int) -> list[int]:
    return [100 * (choice + 1) + k for k in range(count)]


def fake_logprobs(count: int) -> dict[str, Any]:
    return {
        "content": [
            {"token": "t", "logprob": -k / 10, "bytes": [116], "top_logprobs": []}
            for k in range(count)
        ]
    }
