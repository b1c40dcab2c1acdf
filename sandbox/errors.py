"""The sandbox's exception tree. Every class carries a stable ``code``; the HTTP status and
the error body are chosen in one place, ``sandbox.service``, and the client maps an answered
``code`` back to its class through a fixed table (``sandbox.client``).

    SandboxError                 code                 HTTP (sandbox.service)
    ├── InvalidRequest           invalid_request      400  the body does not fit the wire model
    │   └── InvalidArguments     invalid_arguments    400  a tool's arguments miss its schema
    ├── Unauthorized             unauthorized         401  missing or wrong service token
    ├── UnknownTool              unknown_tool         404  no tool of that name
    ├── SessionNotFound          not_found            404  no such session (or another tenant's)
    ├── SessionExists            conflict             409  the session id is taken
    ├── BodyTooLarge             too_large            413  the body exceeds the service's cap
    ├── InternalError            internal             500  a bug in the service (it keeps serving)
    ├── SandboxUnreachable       unreachable          -    client only: no answer (connect failed
    │                                                      or timed out); reported as status 502
    ├── RuntimeUnavailable       runtime_unavailable  -    no isolation here: the service refuses
    │                                                      to start (fails closed)
    ├── ToolTimeout              tool_timeout         -    never an HTTP error: a host-side tool
    │                                                      ran out of time; also a TimeoutError,
    │                                                      so the call fails (exit status 1)
    └── ToolRefused              refused              -    never an HTTP error: the call answers
        │                                                  ``allowed: false`` with ``rule``
        ├── Escape                                         rule "workspace": a path leaves it
        ├── SpecialFile                                    rule "file type": a FIFO, socket or
        │                                                  device, not a file or directory
        ├── EgressDenied                                   rule "egress": outside the allowlist
        └── QueryRefused                                   rule "sql broker": not a read

Raised in the service, ``status`` is None; raised by the client it is the status the service
answered (502 for ``SandboxUnreachable``).
"""

from __future__ import annotations

from typing import ClassVar


class SandboxError(Exception):
    """Any sandbox failure; the client raises the subclass named by the answered code."""

    code: ClassVar[str] = "sandbox_error"

    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status  # the HTTP status the service answered, when the client raised it


class InvalidRequest(SandboxError):
    code = "invalid_request"


class InvalidArguments(InvalidRequest):
    code = "invalid_arguments"


class Unauthorized(SandboxError):
    code = "unauthorized"


class UnknownTool(SandboxError):
    code = "unknown_tool"


class SessionNotFound(SandboxError):
    code = "not_found"


class SessionExists(SandboxError):
    code = "conflict"


class BodyTooLarge(SandboxError):
    code = "too_large"


class InternalError(SandboxError):
    code = "internal"


class SandboxUnreachable(SandboxError):
    code = "unreachable"


class RuntimeUnavailable(SandboxError):
    """The isolation runtime cannot run here: the service must refuse to run code."""

    code = "runtime_unavailable"


class ToolTimeout(SandboxError, TimeoutError):
    """A host-side tool (file I/O) did not finish within the call's wall time. It is an
    ``OSError`` too: a tool call reports it as a failed run, with this message."""

    code = "tool_timeout"


class ToolRefused(SandboxError):
    """A tool refused what the call asked for; the call's result is a denial by ``rule``."""

    code = "refused"
    rule: ClassVar[str] = "tool"


class Escape(ToolRefused):
    """The path leaves the workspace (or goes through a link that would)."""

    rule = "workspace"


class SpecialFile(ToolRefused):
    """The path names a FIFO, socket or device node: file tools touch regular files and
    directories only (opening anything else could block or act on a device)."""

    rule = "file type"


class EgressDenied(ToolRefused):
    """The URL or an address it resolves to is outside the egress allowlist."""

    rule = "egress"


class QueryRefused(ToolRefused):
    """The statement is not of an allowed class, or tried more than reading."""

    rule = "sql broker"
