"""The upstream of bench.agent_loop: a model that calls ``run_python`` (or ``--tool
list_dir``) for the first N steps of a task, then answers with a final message. Run in its own process, so that its time and
the load generator's never share an event loop:

    python -m bench.loop_upstream --port 9001

A task names its length in its first user message, ``task <id> steps=<N>``: a chat request
holding fewer than N ``tool`` messages is answered with one ``run_python`` call (``print(1)``)
whose id is ``call_<id>_<k>`` (k: the tool messages so far), one holding N with a short text
answer. The request's history, not the mock, carries the state: the gateway's hosted loop
and a client driving the same loop through chat completions get the same answers.

Its own time is measured from its side: from a request's last byte read to its answer
written (it answers at once, no decode time), summed in ``GET /stats``
(``{"requests": n, "busy_ms": total}``), which bench.agent_loop subtracts as the model's
time. Everything else (``/tokenize``, health checks, streams) is bench.mock_upstream's.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
from typing import Any

import orjson

from bench.mock_upstream import STREAM_RE, MockProtocol, chat_answer

TASK_RE = re.compile(rb"task ([0-9a-zA-Z_-]+) steps=(\d+)")
TOOL_MSG_RE = re.compile(rb'"role"\s*:\s*"tool"')
# the call each tool step makes: run_python runs a process in the session's interpreter;
# list_dir is answered by the sandbox service itself (the tool whose run costs least)
ARGUMENTS = {"run_python": '{"code": "print(1)"}', "list_dir": '{"path": "."}'}


class Stats:
    requests = 0
    busy_ms = 0.0
    tool = "run_python"


def answer(body: bytes) -> bytes:
    """The chat answer to ``body``: the next tool call of its task, or the final text."""
    m = TASK_RE.search(body)
    task, steps = (m.group(1).decode(), int(m.group(2))) if m else ("none", 0)
    done = len(TOOL_MSG_RE.findall(body))
    message: dict[str, Any] = {"role": "assistant", "content": "done: 1"}
    finish = "stop"
    if done < steps:
        call = {"id": f"call_{task}_{done}", "type": "function",
                "function": {"name": Stats.tool, "arguments": ARGUMENTS[Stats.tool]}}  # fmt: skip
        message, finish = {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"
    return chat_answer(body, message, finish, 8, "loop")


class LoopUpstream(MockProtocol):
    def respond(self, head: bytes, body: bytes) -> None:
        if head.startswith(b"get /stats "):
            self.write_answer(orjson.dumps({"requests": Stats.requests, "busy_ms": Stats.busy_ms}))
        elif head.startswith(b"post /v1/chat/completions ") and not STREAM_RE.search(body):
            t = time.perf_counter()
            self.write_answer(answer(body))
            Stats.requests += 1
            Stats.busy_ms += (time.perf_counter() - t) * 1000
        else:
            super().respond(head, body)


async def serve(port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: LoopUpstream(20, 0.001), "127.0.0.1", port, backlog=1024
    )
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--tool", choices=sorted(ARGUMENTS), default="run_python")
    args = parser.parse_args()
    port, Stats.tool = args.port, args.tool
    try:
        import uvloop

        uvloop.run(serve(port))
    except ImportError:
        asyncio.run(serve(port))


if __name__ == "__main__":
    main()
