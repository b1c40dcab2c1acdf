"""A streamed response (``stream: true``): the hosted loop with each step's chat stream told
as Responses events while it arrives (``capture.StreamOut``, ``stream.StreamTranslator``).

The client gets the stream's start with the first step's; an error answer to that step
is passed on as it is (nothing is stored), unless calls ran before it (approved calls the
request's approval answers ran): then, as for a later step's refusal, the stream starts
and ends ``response.failed``, and the response is stored with those calls. The end event
is sent once the response is stored (a store failure is logged: the stream has begun).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.types import Receive, Scope, Send

from gateway.errors import GatewayError, SandboxUnavailable
from gateway.pipeline.outcome import CLIENT_CLOSED
from gateway.pipeline.responses.capture import StreamOut, error_message
from gateway.pipeline.responses.loop import LoopState
from gateway.pipeline.responses.stream import StreamTranslator
from gateway.pipeline.responses.turn import Turn

if TYPE_CHECKING:
    from gateway.pipeline.responses.serving import ResponsesService


async def serve_stream(
    service: ResponsesService, turn: Turn, scope: Scope, receive: Receive, send: Send
) -> None:
    translator = StreamTranslator(turn.frame, turn.kinds, turn.session)
    state = service.new_state(turn)
    state.output = translator.output  # one list: the translator adds, the loop counts
    await service.preface(turn, state)  # told when the stream starts
    out = StreamOut(send, translator, hold=state.committed, wall=state.wall)
    final = await run_steps(service, turn, state, out, scope, receive)
    if final is None:
        return
    events, response = final
    await service.store(turn, response, translator.output, strict=False)
    await send({"type": "http.response.body", "body": events, "more_body": False})


async def run_steps(
    service: ResponsesService, turn: Turn, state: LoopState, out: StreamOut, scope: Scope,
    receive: Receive,
) -> tuple[bytes, dict[str, Any]] | None:  # fmt: skip
    """The model steps, told through ``out`` as they run, and the hosted calls between
    them; the last event (not yet sent) and the response object to store. None: nothing
    to store (the first step's error answer was passed on, or the client left)."""
    translator = out.translator
    while True:
        out.refused = None
        try:
            await service.pipeline(turn.step(state), scope, state.wall.bound(receive), out.send)
        except GatewayError as exc:
            if not out.started and not out.hold:
                raise
            await out.begin([])
            return failed(translator, state, exc.message)
        if state.wall.hit:
            return await stopped(service, turn, state, out)
        if out.passthrough or (out.refused_status == CLIENT_CLOSED and not out.hold):
            return None  # an error answer passed on, or the client left: nothing to store
        if out.refused is not None:
            return failed(translator, state, error_message(out.refused))
        if not translator.ended and not out.hold:
            return None  # the client left mid-stream
        events, answer = translator.close_step()
        await out.body(events)
        if answer.error is not None:
            state.add(answer)
            return failed(translator, state, answer.error["message"])
        decision = state.add(answer)
        await out.body(translator.running(decision.run))
        try:
            await service.run_calls(turn, decision, answer, state.wall)
        except SandboxUnavailable as exc:
            await out.body(translator.settled([*decision.run, *decision.skipped]))
            return failed(translator, state, exc.message)
        await out.body(translator.settled([*decision.run, *decision.skipped]))
        decision = state.timed(decision)
        if decision.end:
            return translator.end(
                decision.status, usage=state.usage, model=state.model,
                incomplete=decision.incomplete,
            )  # fmt: skip


async def stopped(
    service: ResponsesService, turn: Turn, state: LoopState, out: StreamOut
) -> tuple[bytes, dict[str, Any]]:
    """A step stopped at the wall-clock deadline: what it streamed is closed
    ``incomplete``, its hosted calls are not run, and the response ends ``incomplete``."""
    translator = out.translator
    await out.begin([])  # stopped before its first byte: the stream starts here
    events, answer = translator.close_step()
    await out.body(events)
    decision = state.stopped(answer)
    await service.run_calls(turn, decision, answer)  # settles them as not run
    await out.body(translator.settled(decision.skipped))
    return translator.end(
        decision.status, usage=state.usage, model=state.model, incomplete=decision.incomplete
    )


def failed(
    translator: StreamTranslator, state: LoopState, message: str
) -> tuple[bytes, dict[str, Any]]:
    error = {"code": "server_error", "message": message}
    return translator.end("failed", usage=state.usage, model=state.model, error=error)
