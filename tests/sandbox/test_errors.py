"""The exception tree and its two translations: to HTTP in the service, back to the tree's
classes in the client. The wire codes and statuses are what the gateway relies on."""

from __future__ import annotations

import inspect
import re

import orjson
import pytest

from sandbox import errors
from sandbox.client import BY_CODE, failure
from sandbox.errors import (
    BodyTooLarge,
    EgressDenied,
    Escape,
    InternalError,
    InvalidArguments,
    InvalidRequest,
    QueryRefused,
    RuntimeUnavailable,
    SandboxError,
    SandboxUnreachable,
    SessionExists,
    SessionNotFound,
    SpecialFile,
    ToolRefused,
    ToolTimeout,
    Unauthorized,
    UnknownTool,
)
from sandbox.service import STATUS, error_response

# The documented table (sandbox/errors.py): what the service answers for each error.
WIRE: list[tuple[type[SandboxError], int, str]] = [
    (InvalidRequest, 400, "invalid_request"),
    (InvalidArguments, 400, "invalid_arguments"),
    (Unauthorized, 401, "unauthorized"),
    (UnknownTool, 404, "unknown_tool"),
    (SessionNotFound, 404, "not_found"),
    (SessionExists, 409, "conflict"),
    (BodyTooLarge, 413, "too_large"),
    (InternalError, 500, "internal"),
]
# Members of the tree that the service never answers with: raised, they are bugs (500).
NOT_ANSWERED = {
    SandboxError, SandboxUnreachable, RuntimeUnavailable, ToolRefused, Escape, EgressDenied,
    QueryRefused, SpecialFile, ToolTimeout,
}  # fmt: skip


def answer(exc: Exception) -> tuple[int, dict[str, str]]:
    response = error_response(exc)
    return response.status_code, orjson.loads(response.body)["error"]


def test_every_class_of_the_tree_is_documented_here():
    tree = {
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, SandboxError)
    }
    assert tree == {cls for cls, _, _ in WIRE} | NOT_ANSWERED
    assert set(STATUS) == {cls for cls, _, _ in WIRE}
    for cls in tree:  # the module docstring draws the whole tree
        assert re.search(rf"^[ │]*(?:[├└]── )?{cls.__name__} ", errors.__doc__ or "", re.M), cls


@pytest.mark.parametrize(("cls", "status", "code"), WIRE)
def test_the_service_answers_each_error_with_its_status_and_code(
    cls: type[SandboxError], status: int, code: str
):
    assert cls.code == code
    assert answer(cls("what went wrong")) == (
        status,
        {"message": "what went wrong", "type": "sandbox_error", "code": code},
    )


@pytest.mark.parametrize(
    "exc",
    [RuntimeError("a bug"), KeyError("x"), *(cls("not an HTTP error") for cls in NOT_ANSWERED)],
)
def test_anything_else_is_a_bug_answered_500_without_its_message(exc: Exception):
    status, body = answer(exc)
    assert (status, body["code"]) == (500, "internal")
    assert "see the service log" in body["message"] and str(exc) not in body["message"]


@pytest.mark.parametrize(("cls", "status", "code"), WIRE)
def test_the_client_maps_each_answer_back_to_its_class(
    cls: type[SandboxError], status: int, code: str
):
    response = error_response(cls("what went wrong"))
    exc = failure(response.status_code, bytes(response.body))
    assert type(exc) is cls
    assert (exc.status, exc.code) == (status, code)
    assert str(exc) == f"sandbox answered {status} {code}: what went wrong"


def test_the_client_table_is_fixed_and_names_only_answered_errors():
    answered = {code: cls for cls, _, code in WIRE}
    assert answered == BY_CODE


@pytest.mark.parametrize(
    "raw",
    [
        b'{"error": {"code": "SystemExit", "message": "m"}}',  # never a class the remote names
        b'{"error": {"code": "__class__", "message": "m"}}',
        b'{"error": {"code": ["unknown_tool"], "message": "m"}}',
        b'{"error": "unknown_tool"}',
        b'["unknown_tool"]',
        b"<html>bad gateway</html>",
        b"",
    ],
)
def test_an_answer_the_client_does_not_know_is_the_base_class(raw: bytes):
    exc = failure(502, raw)
    assert type(exc) is SandboxError
    assert (exc.status, exc.code) == (502, "sandbox_error")


def test_a_tool_refusal_names_the_rule_its_denial_carries():
    assert issubclass(ToolRefused, SandboxError)
    assert {c.rule for c in (Escape, EgressDenied, QueryRefused)} == {
        "workspace",
        "egress",
        "sql broker",
    }


def test_errors_raised_in_the_service_carry_no_status():
    exc = SessionNotFound("no session 's'")
    assert exc.status is None and exc.message == str(exc) == "no session 's'"
