"""Reading a request's JSON body: size-limited while it streams in, parsed once, a 4xx
naming the problem otherwise. Every endpoint that takes a body reads it here."""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.requests import Request

from gateway.errors import InvalidRequest, PayloadTooLarge
from gateway.http.protocol import describe
from sandbox.protocol import read_limited

M = TypeVar("M", bound=BaseModel)


async def read_json(request: Request, limit: int, *, empty: bytes | None = None) -> dict[str, Any]:
    """The body as a JSON object. A declared or actual size over ``limit`` is a 413 before
    the rest is read; an empty body is ``empty`` when given (``b"{}"``), else a 400."""
    return (await read_json_raw(request, limit, empty=empty))[1]


async def read_json_raw(
    request: Request, limit: int, *, empty: bytes | None = None
) -> tuple[bytes, dict[str, Any]]:
    """``read_json``, with the bytes the object was parsed from."""
    declared = request.headers.get("content-length")
    raw = await read_limited(request.stream(), limit, declared, PayloadTooLarge) or empty
    if not raw:
        raise InvalidRequest("request body is empty; send a JSON object")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest(f"request body must be a JSON object, not {type(data).__name__}")
    return raw, data


def validated(data: dict[str, Any], model: type[M]) -> M:
    """``data`` as ``model``, or a 400 naming the first problem and its parameter."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, param = describe(exc)
        raise InvalidRequest(message, param=param) from None


def checked(data: dict[str, Any], shape: TypeAdapter[Any]) -> None:
    """Nothing when ``data`` has ``shape`` (a wire TypedDict's adapter,
    ``gateway.http.protocol.REQUESTS``), else a 400 naming the first problem and its
    parameter, as ``validated`` does."""
    try:
        shape.validate_python(data)
    except ValidationError as exc:
        message, param = describe(exc)
        raise InvalidRequest(message, param=param) from None


async def read_model(request: Request, model: type[M], limit: int) -> M:
    """The JSON body (whatever the content-type: curl's -d says form) as ``model``; an
    empty body is ``{}``."""
    return validated(await read_json(request, limit, empty=b"{}"), model)
