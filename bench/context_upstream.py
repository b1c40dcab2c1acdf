"""The stand-in model of ``bench.context --upstream mock``: bench.mock_upstream, plus
answers that make a condensation's quality checkable without a model.

* a question (``bench.context_data.Question.text``: ``QUESTION: earlier in this
  conversation, a tool's output printed a line with <key> and its number. ...``, or its
  error code or file path: ``NOUNS``) is answered by an oracle reader: the first five-digit
  number after ``<key>`` on a line of the prompt (``port_3 = 41234``, ``ERROR job_3 failed:
  exit status 41234``), else ``unknown``; an error code (``E4821``) or a path
  (``dist/bundle_2-3fa9c1.tar``) the same; its accuracy is the share of facts a strategy
  kept in what the model saw;
* a summary request (the gateway's summarizer instructions) gets ``(mock summary)`` and
  filler lines up to about 80% of its ``max_tokens`` (a small model's summary fills what it
  is given): a stand-in cannot summarize, so model-written summaries are measured on the
  real stack only (``--upstream real``), but the room a summary takes is the real one;
* anything else: a short text answer;
* asked for token ids (``return_token_ids``), its ``prompt_token_ids`` come from each
  message's bytes, so that a message unchanged between two requests gives the same ids
  there (``bench.context`` counts the steps whose prompt extends the previous one);
* its context window is ``--window`` (default 8192, bench.mock_upstream's): ``/v1/models``
  and ``/tokenize`` say it (``max_model_len``), and a chat request whose prompt is longer
  (one token per 4 bytes of the body, as its ``usage`` counts) gets vLLM 0.32's
  context-length 400 (``This model's maximum context length is ...``, type
  ``BadRequestError``, param ``input_tokens``), as ``none`` gets from a real tier on a
  session that does not fit. The stored sessions are 4,000-8,150 of these tokens: all fit
  the default window.

    python -m bench.context_upstream --port 9001 [--window 8192]
"""

from __future__ import annotations

import argparse
import asyncio
import re

import orjson

from bench.context_data import NOUNS
from bench.mock_upstream import (
    IDS_RE,
    MAX_MODEL_LEN,
    STREAM_RE,
    MockProtocol,
    chat_answer,
    prompt_tokens,
    tokenize,
)

KIND_OF = {noun.encode(): kind.encode() for kind, noun in NOUNS.items()}
QUESTION_RE = re.compile(
    rb"QUESTION: earlier in this conversation, a tool's output printed a line with (\w+) and "
    rb"its (" + b"|".join(re.escape(n) for n in KIND_OF) + rb")\."
)
VALUES = {  # a value of each kind, as the stored sessions print it (bench.context_families)
    b"number": rb"\b(\d{5})\b",
    b"code": rb"\b(E\d{4})\b",
    b"file": rb"\b([\w.-]+/[\w./-]*\.(?:tar|json|csv|log|txt|py))\b",
}
SUMMARY_MARK = b"You condense an AI agent's working history"


def answer(body: bytes) -> bytes:
    if SUMMARY_MARK in body:
        wanted = orjson.loads(body).get("max_tokens") or 64
        text = "(mock summary)" + "\n- a step was taken" * int(wanted * 0.8 / 6)
    elif (m := QUESTION_RE.search(body)) is not None:
        key, kind = m.group(1), KIND_OF[m.group(2)]
        fact = re.search(re.escape(key) + rb"\b[^\n\\\"]*?" + VALUES[kind], body)
        text = fact.group(1).decode() if fact else "unknown"
    else:
        text = "ok"
    answered = chat_answer(body, {"role": "assistant", "content": text}, "stop", 4, "mock")
    if not IDS_RE.search(body):
        return answered
    data = orjson.loads(answered)
    data["prompt_token_ids"] = message_ids(orjson.loads(body).get("messages") or [])
    return orjson.dumps(data)


def message_ids(messages: list[object]) -> list[int]:
    """Stand-in token ids: four bytes of each message's JSON apiece, message by message."""
    ids: list[int] = []
    for m in messages:
        data = orjson.dumps(m, option=orjson.OPT_SORT_KEYS)
        ids += [int.from_bytes(data[i : i + 4], "little") % 49152 for i in range(0, len(data), 4)]
    return ids


def too_long(body: bytes, window: int) -> bytes | None:
    """vLLM 0.32's 400 for a prompt longer than the window (its renderer's check: the
    prompt alone, ``max_tokens`` clamped to what is left), else None."""
    n = prompt_tokens(body)
    if n <= window:
        return None
    message = (f"This model's maximum context length is {window} tokens. However, your prompt "
               f"contains {n} input tokens, which exceeds this limit even without any output "
               "tokens. Please reduce the length of the input prompt. "
               f"(parameter=input_tokens, value={n})")  # fmt: skip
    error = {"message": message, "type": "BadRequestError", "param": "input_tokens", "code": 400}
    return orjson.dumps({"error": error})


class ContextUpstream(MockProtocol):
    def __init__(self, window: int = MAX_MODEL_LEN) -> None:
        super().__init__(4, 0.0)
        self.window = window

    def respond(self, head: bytes, body: bytes) -> None:
        if head.startswith(b"get /v1/models "):
            data = {"object": "list", "data": [{"id": "mock", "max_model_len": self.window}]}
            self.write_answer(orjson.dumps(data))
        elif head.startswith(b"post /tokenize "):
            data = orjson.loads(tokenize(body))
            self.write_answer(orjson.dumps({**data, "max_model_len": self.window}))
        elif head.startswith(b"post /v1/chat/completions ") and (
            error := too_long(body, self.window)
        ):
            self.write_error(error)
        elif head.startswith(b"post /v1/chat/completions ") and not STREAM_RE.search(body):
            self.write_answer(answer(body))
        else:
            super().respond(head, body)

    def write_error(self, payload: bytes) -> None:
        assert self.transport is not None
        self.transport.write(
            b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(payload), payload)
        )


async def serve(port: int, window: int = MAX_MODEL_LEN) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ContextUpstream(window), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--window", type=int, default=MAX_MODEL_LEN,
                        help="the context window in tokens (max_model_len; longer: a 400)")  # fmt: skip
    args = parser.parse_args()
    if args.window < 1:
        parser.error(f"--window: tokens, 1 or more (got {args.window})")
    asyncio.run(serve(args.port, args.window))


if __name__ == "__main__":
    main()
