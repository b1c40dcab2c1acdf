"""Build the upstream request once: the client's parameters, what capture adds, and the
tier's model name.

The client's body is copied, never changed: every parameter it sent reaches vLLM as sent
(unknown ones included). Two additions, both removed again from what the client sees:

* recording asks for the exact token ids and the sampled tokens' log-probabilities
  (``gateway.recording.capture.prepare``);
* a stream asks for its usage chunk (metrics and recording need the counts); the relay
  drops it and moves its ``system_fingerprint`` onto the finishing chunks, where vLLM puts
  it for a client that did not ask for usage (``gateway.upstream.relay_filter``).

The model name is the serving tier's, so the payload is serialised per tier the request
is sent to (once each: a retry on the same tier reuses the bytes). The fields the session
validator already wrote (``ParsedRequest.encoded``: a named session's messages and tools,
nearly all of an agent's body) are embedded as those bytes (``orjson.Fragment``), not
written again: the same bytes, as orjson writes a list or an object the same way wherever
it stands.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.pipeline.request import PATHS, ParsedRequest
from gateway.recording.capture import Wants, prepare


@dataclass(frozen=True, slots=True)
class UpstreamRequest:
    path: str
    body: dict[str, Any]  # what the tiers get, but for ``model``
    stream: bool
    wants: Wants | None  # what the client asked to see of the captured fields; None: not captured
    strip_usage: bool  # the usage chunk is the gateway's, not the client's
    # fields of ``body`` already written (``ParsedRequest.encoded``), embedded as they are
    written: dict[str, orjson.Fragment] = field(default_factory=dict, compare=False, repr=False)
    _payloads: dict[str, bytes] = field(default_factory=dict, compare=False, repr=False)

    def payload(self, model: str) -> bytes:
        """The JSON bytes sent to a tier serving ``model``."""
        found = self._payloads.get(model)
        if found is None:
            # an existing key keeps its place: the same order as the body's
            found = orjson.dumps({**self.body, "model": model, **self.written})
            self._payloads[model] = found
        return found


def build_upstream_request(
    parsed: ParsedRequest, *, capture: bool, messages: list[Any] | None = None
) -> UpstreamRequest:
    """``capture``: ask the engine for token ids and log-probabilities (recording is on);
    ``messages``: the context stage's condensed messages, in place of the client's."""
    body = dict(parsed.body)
    if messages is not None:
        body["messages"] = messages
    stream = parsed.stream
    options = body.get("stream_options")
    strip_usage = stream and not (isinstance(options, dict) and options.get("include_usage"))
    if strip_usage:
        body["stream_options"] = {**(options or {}), "include_usage": True}
        if body["stream_options"].get("continuous_usage_stats"):
            # without include_usage vLLM sends no usage at all; with it, continuous stats
            # would put usage in every chunk the client gets: ask for the final one alone
            body["stream_options"]["continuous_usage_stats"] = False
    wants = prepare(parsed.identity.endpoint, body) if capture else None
    written = {
        key: orjson.Fragment(data)
        for key, data in parsed.encoded.items()
        if key in body and body[key] is parsed.body.get(key)  # still the client's value
    }
    return UpstreamRequest(
        PATHS[parsed.identity.endpoint], body, stream, wants, strip_usage, written
    )
