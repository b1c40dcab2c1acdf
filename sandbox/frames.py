"""The lean hop for tool calls: length-prefixed JSON frames on a Unix socket beside the
service's HTTP one (``<socket>.frames``), one persistent connection per call in flight.

An HTTP request costs the gateway's aiohttp client and the service's uvicorn and
Starlette work on every call; a frame costs a write and a read. Only ``POST /v1/tools/{name}`` travels this way (the rest stays HTTP), with
the same token, models, limits and errors:

    connection   first frame  {"token": "..."}: compared in constant time; a wrong one is
                 answered 401 (``Unauthorized``) and the connection closed
    request      {"tool": name, "call": ToolCall}
    reply        {"status": 200, "result": ToolResult} or {"status": s, "error": {...}},
                 the status and error body the HTTP route answers

A frame is a 4-byte big-endian length and that many bytes; a request past the service's
body limit is answered 413 and its connection closed. The socket is the service user's
alone (mode 0600), and the token is checked on each connection all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import os
import struct
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import ValidationError

from sandbox.errors import BodyTooLarge, InvalidRequest, Unauthorized
from sandbox.protocol import ToolCall, describe_validation

if TYPE_CHECKING:
    from sandbox.core import Sandbox

log = logging.getLogger("gearshift.sandbox")
HEADER = struct.Struct(">I")
SUFFIX = ".frames"
HELLO_MAX = 4096
CLOSED_AFTER = (401, 413)  # answers after which the service closes the connection
# The service's translation of an exception: (HTTP status, {"error": {...}}).
ErrorAnswer = Callable[[Exception], tuple[int, dict[str, Any]]]


class FrameTooLarge(Exception):
    pass


def frames_path(socket: Path | str) -> Path:
    """Where the frames socket of the service listening on ``socket`` is."""
    return Path(f"{socket}{SUFFIX}")


def frame(obj: Any) -> bytes:
    body = orjson.dumps(obj)
    return HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader, limit: int) -> bytes:
    """One frame's body (``IncompleteReadError`` at the end of the stream)."""
    (size,) = HEADER.unpack(await reader.readexactly(HEADER.size))
    if size > limit:
        raise FrameTooLarge(f"a frame of {size} bytes exceeds the limit of {limit} bytes")
    return await reader.readexactly(size)


async def serve(
    sandbox: Sandbox, path: Path, limit: int, answer_error: ErrorAnswer
) -> asyncio.AbstractServer:
    """Listen on ``path``; ``answer_error(exc) -> (status, body)`` is the HTTP route's
    translation of an exception, so both ways answer alike."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # left by a service that was killed
    server = await asyncio.start_unix_server(
        lambda r, w: _connection(sandbox, r, w, limit, answer_error), path=str(path)
    )
    os.chmod(path, 0o600)
    return server


async def _connection(
    sandbox: Sandbox,
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    limit: int,
    answer_error: ErrorAnswer,
) -> None:
    try:
        hello = orjson.loads(await read_frame(reader, HELLO_MAX))
        token = hello.get("token") if isinstance(hello, dict) else None
        if not isinstance(token, str) or not hmac.compare_digest(token.encode(), sandbox.token):
            writer.write(
                frame(_error(answer_error, Unauthorized("missing or wrong sandbox token")))
            )
            await writer.drain()
            return
        while True:
            try:
                raw = await read_frame(reader, limit)
            except FrameTooLarge as exc:
                writer.write(frame(_error(answer_error, BodyTooLarge(str(exc)))))
                await writer.drain()
                return
            writer.write(frame(await _answer(sandbox, raw, answer_error)))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, FrameTooLarge, orjson.JSONDecodeError):
        pass  # the gateway went away, or it is not a gateway: nothing to answer
    finally:
        writer.close()


async def _answer(sandbox: Sandbox, raw: bytes, answer_error: ErrorAnswer) -> dict[str, Any]:
    try:
        request = orjson.loads(raw)
        if not isinstance(request, dict) or not isinstance(request.get("tool"), str):
            raise InvalidRequest("a frame names its 'tool' and carries the 'call'")
        try:
            call = ToolCall.model_validate(request.get("call"))
        except ValidationError as exc:
            raise InvalidRequest(describe_validation(exc.errors(include_url=False))[0]) from None
        result = await sandbox.call(request["tool"], call)
        return {"status": 200, "result": result.model_dump()}
    except orjson.JSONDecodeError:
        return _error(answer_error, InvalidRequest("a frame is not JSON"))
    except Exception as exc:  # domain errors and bugs alike, translated as HTTP's are
        return _error(answer_error, exc)


def _error(answer_error: ErrorAnswer, exc: Exception) -> dict[str, Any]:
    status, body = answer_error(exc)
    return {"status": status, **body}
