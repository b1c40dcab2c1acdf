"""The stand-in model of ``bench.context --upstream mock``: bench.mock_upstream, plus
answers that make a condensation's quality checkable without a model.

* a question ``QUESTION: what number goes with <key>?`` is answered by an oracle reader:
  the first five-digit number after ``<key>`` on a line of the prompt (``port_3 = 41234``,
  ``ERROR job_3 failed: exit status 41234``), else ``unknown``; ``what code`` and ``what
  file`` the same with an error code (``E4821``) or a path (``dist/bundle_2-3fa9c1.tar``);
  its accuracy is the share of facts a strategy kept in what the model saw;
* a summary request (the gateway's summarizer instructions) gets ``(mock summary)`` and
  filler lines up to about 80% of its ``max_tokens`` (a small model's summary fills what it
  is given): a stand-in cannot summarize, so model-written summaries are measured on the
  real stack only (``--upstream real``), but the room a summary takes is the real one;
* anything else: a short text answer;
* asked for token ids (``return_token_ids``), its ``prompt_token_ids`` come from each
  message's bytes, so that a message unchanged between two requests gives the same ids
  there (``bench.context`` counts the steps whose prompt extends the previous one).

    python -m bench.context_upstream --port 9001
"""

from __future__ import annotations

import argparse
import asyncio
import re

import orjson

from bench.mock_upstream import IDS_RE, STREAM_RE, MockProtocol, chat_answer

QUESTION_RE = re.compile(rb"QUESTION: what (number|code|file) goes with (\w+)\?")
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
        kind, key = m.group(1), m.group(2)
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


class ContextUpstream(MockProtocol):
    def respond(self, head: bytes, body: bytes) -> None:
        if head.startswith(b"get /v1/models "):
            data = {"object": "list", "data": [{"id": "mock", "max_model_len": 8192}]}
            self.write_answer(orjson.dumps(data))
        elif head.startswith(b"post /v1/chat/completions ") and not STREAM_RE.search(body):
            self.write_answer(answer(body))
        else:
            super().respond(head, body)


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: ContextUpstream(4, 0.0), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    asyncio.run(serve(parser.parse_args().port))


if __name__ == "__main__":
    main()
