"""A response prepared: everything that may refuse the request, before any model call or
store write, and what each model step of it is built from.

    prepare   load the previous_response_id chain (store) → check and normalize the
              input items → the decisions on the chain's approval requests → the hosted
              tools' schemas (sandbox) and the MCP servers' tools → chat messages → chat
              body → a ``ParsedRequest`` of the chain's session

A chain is one trajectory session, named by the client's ``X-Session-Id`` or else after the
chain's first response id; its sandbox session (the hosted tools' workspace) is the same.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sqlalchemy import Connection

from gateway.pipeline.request import ParsedRequest, RequestIdentity
from gateway.pipeline.responses import approvals, chat, hosted, items, mcp_calls
from gateway.pipeline.responses.loop import LoopState
from gateway.pipeline.responses.mcp_calls import McpOffer
from gateway.pipeline.responses.output import Frame
from gateway.pipeline.responses.protocol import ResponsesRequest
from gateway.pipeline.responses.sandbox_offers import SandboxOffers
from gateway.pipeline.services import Services
from gateway.store import responses as stored

StoreCall = Callable[[Callable[[Connection], Any], str | None], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Turn:
    """A prepared response: what it will say, the chat request of its first step, what it
    adds, and what each later step is built from."""

    frame: Frame
    parsed: ParsedRequest
    inputs: list[dict[str, Any]]
    session: str
    history: Sequence[dict[str, Any]] = ()  # the chain's items
    kinds: dict[str, str] = field(default_factory=dict)  # hosted tools by function name
    offered: Sequence[Any] = ()  # their chat schemas
    mcp: McpOffer = field(default_factory=McpOffer)  # MCP servers, their new listings
    decisions: Sequence[approvals.Decision] = ()  # the chain's approval requests, decided

    def step(self, state: LoopState) -> ParsedRequest:
        """The chat request of the next model step: the chain, the input and the output so far."""
        request = self.frame.request
        as_asked = state.step_tokens == request.max_output_tokens  # no token cap lowers it
        if state.turns == 0 and not self.decisions and as_asked:
            return self.parsed
        messages = items.to_messages(
            list(self.history), [*self.inputs, *state.output], request.instructions
        )
        body = chat.chat_body(
            request, messages, self.frame.spec, self.offered, first=state.turns == 0,
            max_tokens=state.step_tokens,
        )  # fmt: skip
        return ParsedRequest(self.parsed.identity, body)


async def prepare(
    services: Services,
    request: ResponsesRequest,
    who: RequestIdentity,
    call: StoreCall,
    asked: SandboxOffers,
) -> Turn:
    """Everything that may refuse the request, before any model call or store write;
    ``call`` runs a store operation (a missing response: a 404 naming the parameter)."""
    spec = chat.echo(request)
    mcp_settings = services.settings.responses.mcp
    servers = mcp_calls.targets(mcp_settings, who.tenant, spec.mcp)  # the allowlist
    kinds, offered = await hosted.offer(services, spec.hosted, who, asked)
    chain = stored.Chain("", [])
    if request.previous_response_id is not None:
        prev = request.previous_response_id
        chain = await call(lambda c: stored.load_chain(c, who.tenant, prev), "previous_response_id")
    inputs = items.normalize_input(request.input, (i["id"] for i in chain.items))
    decisions = approvals.resolve(
        chain.items, inputs, continuing=request.previous_response_id is not None,
        labels={*servers, *([hosted.SERVER_LABEL] if spec.hosted else [])},
        approver=f"client:{who.api_key}",
    )  # fmt: skip
    taken = [*kinds, *(t["name"] for t in spec.functions)]
    # a listing the client sent back (stateless continuation) counts as the chain's own
    known = [*chain.items, *inputs]
    mcp = await mcp_calls.offer(mcp_settings, spec.mcp, servers, known, taken)
    kinds, offered = kinds | mcp.kinds, [*offered, *mcp.offered]
    chat.check_forced(spec, kinds)
    messages = items.to_messages(chain.items, inputs, request.instructions)
    frame = Frame.new(request, spec, request.stored and services.recorder is not None)
    session = who.session_id or chain.session or frame.id
    identity = replace(who, endpoint="chat", requested_model=request.model, session_id=session)
    body = chat.chat_body(request, messages, spec, offered)
    parsed = ParsedRequest(identity, body)
    return Turn(frame, parsed, inputs, session, chain.items, kinds, offered, mcp, decisions)
