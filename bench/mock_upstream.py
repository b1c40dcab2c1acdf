"""A minimal, fast OpenAI-style upstream for overhead benchmarks.

Raw asyncio HTTP/1.1 with keep-alive, canned answers, no framework: it should
cost far less per request than anything measured against it. Streams send
``--chunks`` content events, ``--gap-ms`` apart so that each one reaches the
proxy as its own read, then usage (when asked) and ``[DONE]``.

    python -m bench.mock_upstream --port 9001 [--chunks 20] [--gap-ms 1]
"""

from __future__ import annotations

import argparse
import asyncio
import re
from typing import Any

import orjson

STREAM_RE = re.compile(rb'"stream"\s*:\s*true')
USAGE_RE = re.compile(rb'"include_usage"\s*:\s*true')
MODEL_RE = re.compile(rb'"model"\s*:\s*"([^"]*)"')


def _completion(model: bytes) -> bytes:
    return orjson.dumps(
        {
            "id": "chatcmpl-mock",
            "object": "chat.completion",
            "created": 1,
            "model": model.decode(),
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "The capital of France is Paris."},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 8, "total_tokens": 20},
        }
    )


def _event(model: bytes, delta: dict[str, str], finish: str | None = None) -> bytes:
    payload = orjson.dumps(
        {
            "id": "chatcmpl-mock",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": model.decode(),
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }
    )
    return b"data: " + payload + b"\n\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class MockProtocol(asyncio.Protocol):
    def __init__(self, chunks: int, gap_s: float) -> None:
        self.chunks = chunks
        self.gap_s = gap_s
        self.buf = b""
        self.tasks: set[asyncio.Future[None]] = set()
        self.transport: Any = None  # uvloop's transports are not asyncio.Transport subclasses

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while True:
            head_end = self.buf.find(b"\r\n\r\n")
            if head_end < 0:
                return
            head = self.buf[:head_end].lower()
            m = re.search(rb"content-length:\s*(\d+)", head)
            length = int(m.group(1)) if m else 0
            if len(self.buf) < head_end + 4 + length:
                return
            body = self.buf[head_end + 4 : head_end + 4 + length]
            self.buf = self.buf[head_end + 4 + length :]
            self.respond(head, body)

    def respond(self, head: bytes, body: bytes) -> None:
        assert self.transport is not None
        if head.startswith(b"get"):
            self.transport.write(
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-type: application/json\r\n\r\n{}"
            )
            return
        m = MODEL_RE.search(body)
        model = m.group(1) if m else b"mock"
        if STREAM_RE.search(body):
            task = asyncio.ensure_future(self.stream(model, bool(USAGE_RE.search(body))))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
            return
        payload = _completion(model)
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (len(payload), payload)
        )

    async def stream(self, model: bytes, usage: bool) -> None:
        t = self.transport
        assert t is not None
        t.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            + _chunked(_event(model, {"role": "assistant", "content": ""}))
        )
        for i in range(self.chunks):
            await asyncio.sleep(self.gap_s)
            if t.is_closing():
                return
            finish = "stop" if i == self.chunks - 1 else None
            t.write(_chunked(_event(model, {"content": f" tok{i}"}, finish)))
        tail = b""
        if usage:
            u = {
                "prompt_tokens": 12,
                "completion_tokens": self.chunks,
                "total_tokens": 12 + self.chunks,
            }
            tail = (
                b"data: "
                + orjson.dumps(
                    {
                        "id": "chatcmpl-mock",
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": model.decode(),
                        "choices": [],
                        "usage": u,
                    }
                )
                + b"\n\n"
            )
        if not t.is_closing():
            t.write(_chunked(tail + b"data: [DONE]\n\n") + b"0\r\n\r\n")


async def serve(port: int, chunks: int, gap_s: float) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: MockProtocol(chunks, gap_s), "127.0.0.1", port, backlog=1024
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--gap-ms", type=float, default=1.0)
    args = parser.parse_args()
    try:
        import uvloop

        uvloop.run(serve(args.port, args.chunks, args.gap_ms / 1000))
    except ImportError:
        asyncio.run(serve(args.port, args.chunks, args.gap_ms / 1000))


if __name__ == "__main__":
    main()
