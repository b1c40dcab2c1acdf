"""A minimal, fast OpenAI-style upstream for overhead benchmarks.

Raw asyncio HTTP/1.1 with keep-alive, canned answers, no framework: it should
cost far less per request than anything measured against it. Streams send
``--chunks`` content events, ``--gap-ms`` apart so that each one reaches the
proxy as its own read, then usage (when asked) and ``[DONE]``. Like vLLM it adds
token ids (``return_token_ids``) and the sampled tokens' logprobs (``logprobs``)
when asked, so that recording can be measured; ``--latency-ms`` delays every
answer, as an engine's decode time would. A prompt counts one token per 4 bytes of the
request body (``usage.prompt_tokens``, ``prompt_token_ids``), about what a tokenizer makes
of JSON. ``POST /tokenize`` answers in vLLM's shape (``count``, ``max_model_len``,
``tokens``, ``token_strs``), with tokens derived from the request's bytes without its
``model``: every tier served by one mock is then one family to the gateway's start-up
check, and its token calibration has counts to fit.

What it answers: a request of a ``bench.agent_body`` session (its task names the session)
gets the assistant message that the session's next request carries (``session_answers``:
a tool call, streamed as tool-call deltas; the last step a closing text), so an agent
echoes the answer it got, as agents do; any other request, a canned sentence.
``--answers canned`` answers every request with that sentence: the worst case for anything
that links a step to the answer before it (the recorder's chain, prefix caches), since no
request then carries the answer it got.

    python -m bench.mock_upstream --port 9001 [--chunks 20] [--gap-ms 1] [--latency-ms 0]
        [--answers session|canned]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import re
from collections.abc import Coroutine
from typing import Any

import orjson

from bench.agent_body import TICKET, session_answers

STREAM_RE = re.compile(rb'"stream"\s*:\s*true')
USAGE_RE = re.compile(rb'"include_usage"\s*:\s*true')
IDS_RE = re.compile(rb'"return_token_ids"\s*:\s*true')
LOGPROBS_RE = re.compile(rb'"logprobs"\s*:\s*true')
MAX_MODEL_LEN = 8192
ANSWER = "The capital of France is Paris."
MODEL_RE = re.compile(rb'"model"\s*:\s*"([^"]*)"')
CANNED = {"role": "assistant", "content": ANSWER}
ANSWERS = ("session", "canned")
TOOL_RESULT = b'"tool_call_id"'  # one in each tool message of a request


@functools.lru_cache(maxsize=256)
def _answers(seed: int) -> tuple[dict[str, Any], ...]:
    return tuple(session_answers(seed))


def session_answer(body: bytes) -> dict[str, Any] | None:
    """The answer to a request of a ``bench.agent_body`` session: the assistant message its
    next request carries (its step: the tool results it holds); None for another request."""
    m = TICKET.search(body)
    if m is None:
        return None
    answers = _answers(int(m.group(1)))
    return answers[min(body.count(TOOL_RESULT), len(answers) - 1)]


def _split(text: str, n: int) -> list[str]:
    """``text`` in ``n`` consecutive pieces (some empty when it is shorter)."""
    return [text[i * len(text) // n : (i + 1) * len(text) // n] for i in range(n)]


def _deltas(message: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """``message`` as about ``n`` stream deltas: its text in pieces, or each tool call as
    vLLM streams one (id and name first, then the arguments in pieces)."""
    calls = message.get("tool_calls")
    if not calls:
        return [{"content": piece} for piece in _split(message.get("content") or "", n)]
    out: list[dict[str, Any]] = []
    per = max(1, n // len(calls) - 1)
    for i, call in enumerate(calls):
        fn = call["function"]
        head = {"name": fn["name"], "arguments": ""}
        out.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                    "function": head}]})  # fmt: skip
        out += [
            {"tool_calls": [{"index": i, "function": {"arguments": piece}}]}
            for piece in _split(fn["arguments"], per)
        ]
    return out


def _tokens(message: dict[str, Any]) -> list[str]:
    """The answer's tokens, about: its words (the tool calls' arguments' for a call)."""
    calls = message.get("tool_calls") or ()
    text = message.get("content") or " ".join(c["function"]["arguments"] for c in calls)
    return [w + " " for w in text.split()] + ["<|im_end|>"]


def _logprobs(tokens: list[str]) -> dict[str, object]:
    return {
        "content": [
            {"token": t, "logprob": -0.25, "bytes": list(t.encode()), "top_logprobs": []}
            for t in tokens
        ]
    }


@functools.lru_cache(maxsize=64)
def _prompt_ids(n: int) -> list[int]:
    return list(range(1, n + 1))


def prompt_tokens(body: bytes) -> int:
    """The prompt's length in tokens: one per 4 bytes of the request body."""
    return max(1, len(body) // 4)


def chat_answer(
    body: bytes, message: dict[str, Any], finish: str, completion: int, name: str
) -> bytes:
    """A whole chat completion answering ``body`` with ``message``, sized from the body; with
    the token ids vLLM adds when the body asks for them (as a recording gateway's does)."""
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish,
                              "logprobs": None}  # fmt: skip
    prompt = prompt_tokens(body)
    model = MODEL_RE.search(body)
    data: dict[str, Any] = {
        "id": f"chatcmpl-{name}", "object": "chat.completion", "created": 1,
        "model": (model.group(1) if model else b"mock").decode(), "choices": [choice],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    }  # fmt: skip
    if IDS_RE.search(body):
        choice["token_ids"] = list(range(1000, 1000 + completion))
        data["prompt_token_ids"] = _prompt_ids(prompt)
    return orjson.dumps(data)


def tokenize(body: bytes) -> bytes:
    """vLLM's ``/tokenize`` answer for ``body``: tokens from its bytes, ``model`` left out."""
    request = orjson.loads(body or b"{}")
    request.pop("model", None)
    data = orjson.dumps(request, option=orjson.OPT_SORT_KEYS)
    tokens = [int.from_bytes(data[i : i + 4], "little") % 49152 for i in range(0, len(data), 4)]
    return orjson.dumps(
        {"count": len(tokens), "max_model_len": MAX_MODEL_LEN, "tokens": tokens, "token_strs": None}
    )


def _completion(
    model: bytes,
    ids: bool = False,
    logprobs: bool = False,
    prompt: int = 40,
    message: dict[str, Any] | None = None,
) -> bytes:
    message = message or CANNED
    tokens = _tokens(message)
    choice: dict[str, object] = {
        "index": 0,
        "message": message,
        "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
        "logprobs": _logprobs(tokens) if logprobs else None,
    }
    data: dict[str, object] = {
        "id": "chatcmpl-mock",
        "object": "chat.completion",
        "created": 1,
        "model": model.decode(),
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": len(tokens),
            "total_tokens": prompt + len(tokens),
        },
    }
    if ids:
        choice["token_ids"] = list(range(1000, 1000 + len(tokens)))
        data["prompt_token_ids"] = _prompt_ids(prompt)
    return orjson.dumps(data)


def _event(
    model: bytes,
    delta: dict[str, Any],
    finish: str | None = None,
    capture: tuple[bool, bool] = (False, False),
    k: int = -1,
    prompt: int = 40,
) -> bytes:
    ids, logprobs = capture
    choice: dict[str, object] = {
        "index": 0,
        "delta": delta,
        "finish_reason": finish,
        "logprobs": None,
    }
    data: dict[str, object] = {
        "id": "chatcmpl-mock",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": model.decode(),
        "choices": [choice],
    }
    if k >= 0 and ids:
        choice["token_ids"] = [1000 + k]
    if k >= 0 and logprobs:
        choice["logprobs"] = _logprobs([delta.get("content", "")])
    if k < 0 and ids:
        data["prompt_token_ids"] = _prompt_ids(prompt)
    return b"data: " + orjson.dumps(data) + b"\n\n"


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class MockProtocol(asyncio.Protocol):
    def __init__(
        self, chunks: int, gap_s: float, latency_s: float = 0.0, answers: str = "session"
    ) -> None:
        self.chunks = chunks
        self.gap_s = gap_s
        self.latency_s = latency_s
        self.sessions = answers == "session"  # else every answer is the canned one
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
        if head.startswith(b"post /tokenize "):
            self.write_answer(tokenize(body))
            return
        m = MODEL_RE.search(body)
        model = m.group(1) if m else b"mock"
        capture = (bool(IDS_RE.search(body)), bool(LOGPROBS_RE.search(body)))
        prompt = prompt_tokens(body)
        message = session_answer(body) if self.sessions else None
        if STREAM_RE.search(body):
            usage = bool(USAGE_RE.search(body))
            self.spawn(self.stream(model, usage, capture, prompt, message))
        elif self.latency_s:
            self.spawn(self.answer(_completion(model, *capture, prompt, message)))
        else:
            self.write_answer(_completion(model, *capture, prompt, message))

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def answer(self, payload: bytes) -> None:
        await asyncio.sleep(self.latency_s)
        if not self.transport.is_closing():
            self.write_answer(payload)

    def write_answer(self, payload: bytes) -> None:
        self.transport.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
            % (len(payload), payload)
        )

    async def stream(
        self,
        model: bytes,
        usage: bool,
        capture: tuple[bool, bool],
        prompt: int,
        message: dict[str, Any] | None = None,
    ) -> None:
        """``message`` streamed (the canned answer: ``chunks`` numbered words)."""
        if message is None:
            deltas = [{"content": f" tok{i}"} for i in range(self.chunks)]
            finish = "stop"
        else:
            deltas = _deltas(message, self.chunks)
            finish = "tool_calls" if message.get("tool_calls") else "stop"
        t = self.transport
        assert t is not None
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        t.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            + _chunked(
                _event(model, {"role": "assistant", "content": ""}, capture=capture, prompt=prompt)
            )
        )
        for i, delta in enumerate(deltas):
            await asyncio.sleep(self.gap_s)
            if t.is_closing():
                return
            last = finish if i == len(deltas) - 1 else None
            t.write(_chunked(_event(model, delta, last, capture, i)))
        tail = b""
        if usage:
            u = {
                "prompt_tokens": prompt,
                "completion_tokens": len(deltas),
                "total_tokens": prompt + len(deltas),
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


async def serve(
    port: int, chunks: int, gap_s: float, latency_s: float = 0.0, answers: str = "session"
) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: MockProtocol(chunks, gap_s, latency_s, answers), "127.0.0.1", port, backlog=1024
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--gap-ms", type=float, default=1.0)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument(
        "--answers", choices=ANSWERS, default="session",
        help="session: a bench.agent_body session's request gets the answer its next request "
        "carries; canned: every request gets the same sentence",
    )  # fmt: skip
    args = parser.parse_args()
    coro = serve(args.port, args.chunks, args.gap_ms / 1000, args.latency_ms / 1000, args.answers)
    try:
        import uvloop

        uvloop.run(coro)
    except ImportError:
        asyncio.run(coro)


if __name__ == "__main__":
    main()
