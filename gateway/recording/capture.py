"""Ask the engine for exact tokens and behaviour log-probabilities; give clients what they asked.

``prepare`` adds ``return_token_ids`` and ``logprobs`` to the upstream body and
remembers what the client itself requested. ``strip`` turns the answer to that body
back into vLLM's answer to the client's own body, so recording never changes what a
client sees. ``StreamCapture`` does both for a stream, chunk by chunk: one chunk may
carry several tokens (speculative decoding), several choices, and tool-call deltas
that must be assembled by ``index``.

What the two added fields change in vLLM 0.32's answers (and what is undone here):

* every capture field comes back filled where the client gets ``null`` (vLLM writes
  the keys either way, so they are set to ``None``, not removed);
* completions with ``echo``: ``return_token_ids`` drops the prompt's text from the
  echo (the ids stand for it); ``logprobs`` makes vLLM fill ``prompt_logprobs`` and
  put the prompt's tokens in front of the completion's in ``logprobs``;
* chat streams: a token that yields no delta (a tool-call tag) still gets a chunk of
  its own, for its id and log-probability;
* some requests vLLM refuses (``top_logprobs`` or ``logprob_token_ids`` without
  ``logprobs``; beam search with ``echo`` and ``logprobs``) or fails mid-stream (an echo
  with ``logprobs`` and ``n`` > 1) only with ``logprobs``: those get no ``logprobs``
  added (their records have ids but no log-probabilities).

A completions ``echo`` of a prompt given as token ids is vLLM's decoding of them, which
the gateway cannot redo: that request also goes as sent, and its record has no ids (and
its text starts with the echo).

What is recorded of a completions choice is the completion's own: its ids, and the
log-probabilities left once an echo's prompt part is cut off (``_own_tokens``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.recording.cut import as_written, cut_prompt_ids
from gateway.recording.records import ChoiceCapture, RawJson


@dataclass(frozen=True, slots=True)
class Wants:
    """What the client asked to see of the capture fields, and what to put back."""

    logprobs: bool
    token_ids: bool
    prompt_logprobs: bool = True  # completions: vLLM shows them for the client's own body
    echo: bool = False  # completions: the client asked for its prompt in front of the text
    echo_prompts: tuple[str, ...] = ()  # prompt texts capture's token ids took out of the echo
    n: int = 1  # completions choices per prompt: choice ``i`` echoes prompt ``i // n``


def prepare(endpoint: str, body: dict[str, Any]) -> Wants:
    """Mutate ``body`` so that the engine returns token ids and per-token log-probabilities."""
    if endpoint == "chat":
        return _prepare_chat(body)
    return _prepare_completions(body)


def _prepare_chat(body: dict[str, Any]) -> Wants:
    wants = Wants(logprobs=bool(body.get("logprobs")), token_ids=bool(body.get("return_token_ids")))
    body["return_token_ids"] = True
    # vLLM refuses top_logprobs / logprob_token_ids without logprobs: let it.
    if wants.logprobs or not (body.get("logprob_token_ids") or _set(body.get("top_logprobs"))):
        body["logprobs"] = True
    return wants


def _prepare_completions(body: dict[str, Any]) -> Wants:
    asked = body.get("logprobs")  # an int; 0 asks for the sampled token's alone
    token_ids = bool(body.get("return_token_ids"))
    echo = bool(body.get("echo"))
    prompts = _prompt_texts(body.get("prompt"))
    n = body.get("n")
    wants = Wants(
        logprobs=asked is not None,
        token_ids=token_ids,
        # vLLM: prompt_logprobs defaults to logprobs when echoing
        prompt_logprobs=body.get("prompt_logprobs") is not None or (echo and asked is not None),
        echo=echo,
        echo_prompts=(prompts or ()) if echo and not token_ids else (),
        n=n if isinstance(n, int) and n > 0 else 1,
    )
    if echo and not token_ids and prompts is None:
        return wants  # an echo of token ids: see the module docstring
    body["return_token_ids"] = True
    if asked is None and not _logprobs_change_answer(body, wants):
        body["logprobs"] = 0  # the sampled token's log-probability, no alternatives
    return wants


def _logprobs_change_answer(body: dict[str, Any], wants: Wants) -> bool:
    """Whether adding ``logprobs`` would change how vLLM 0.32 answers a completions request:
    it refuses ``logprob_token_ids`` without ``logprobs``, and ``echo`` with ``logprobs`` in
    beam search; a stream that echoes with ``logprobs`` and ``n`` > 1 fails once the
    second sample starts (``KeyError`` on the prompt's first token: its prompt
    log-probabilities went with the first sample's chunk)."""
    if body.get("logprob_token_ids"):
        return True
    return wants.echo and bool(body.get("use_beam_search") or (body.get("stream") and wants.n > 1))


def _set(value: object) -> bool:
    return value is not None and value is not False and value != 0


def _prompt_texts(prompt: object) -> tuple[str, ...] | None:
    """The prompts as texts (what vLLM echoes as given), or None for token ids or embeds."""
    if isinstance(prompt, str):
        return (prompt,)
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        return tuple(prompt)
    return None


def strip(data: dict[str, Any], wants: Wants) -> None:
    """Make one whole answer to the prepared body the answer to the client's own body."""
    _hide(data, wants, echo_chunks=())
    for c in _choices(data):
        _restore_echo(c, wants)


def _hide(data: dict[str, Any], wants: Wants, echo_chunks: tuple[int, ...]) -> None:
    """Set to null what the client did not ask for; ``echo_chunks``: the indexes of stream
    chunks that echo the prompt (vLLM sends its ids there whether asked or not)."""
    if not wants.token_ids:
        _null(data, "prompt_token_ids")
    for c in _choices(data):
        _hide_choice(c, wants, echo=_index(c) in echo_chunks)


def _hide_choice(c: dict[str, Any], wants: Wants, *, echo: bool) -> bool:
    """``_hide`` for one choice; whether it changed anything."""
    changed = False
    if not wants.token_ids:
        changed = _null(c, "token_ids")
        if not echo:
            changed = _null(c, "prompt_token_ids") or changed
    if not wants.logprobs:
        changed = _null(c, "logprobs") or changed
    if not wants.prompt_logprobs:
        changed = _null(c, "prompt_logprobs") or changed
    return changed


def _null(obj: dict[str, Any], key: str) -> bool:
    if obj.get(key) is None:
        return False
    obj[key] = None
    return True


def _restore_echo(c: dict[str, Any], wants: Wants) -> bool:
    i = _index(c) // wants.n
    if i < len(wants.echo_prompts) and isinstance(c.get("text"), str):
        c["text"] = wants.echo_prompts[i] + c["text"]
        return True
    return False


def _choices(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for c in data.get("choices") or () if isinstance(c, dict)]


def _index(c: dict[str, Any]) -> int:
    i = c.get("index")
    return i if isinstance(i, int) else 0


def sampled_logprobs(logprobs: Any) -> list[float]:
    """The sampled tokens' log-probabilities from a chat or completions ``logprobs`` object."""
    if not isinstance(logprobs, dict):
        return []
    content = logprobs.get("content")
    if isinstance(content, list):  # chat
        return [float(e["logprob"]) for e in content if isinstance(e, dict)]
    values = logprobs.get("token_logprobs")  # completions
    if isinstance(values, list):
        return [float(v) if v is not None else 0.0 for v in values]
    return []


def _own_tokens(c: dict[str, Any]) -> tuple[list[int] | None, list[float]]:
    """The generated tokens' ids and log-probabilities of one completions choice (or chunk).

    An echo puts the prompt's tokens in front of the completion's in ``logprobs``; with
    ``max_tokens: 0`` vLLM generates one token, reports its id and shows nothing of it.
    """
    ids = c.get("token_ids") if isinstance(c.get("token_ids"), list) else None
    lps = sampled_logprobs(c.get("logprobs"))
    echoed = _echoed(c)
    if echoed:
        lps = lps[echoed:]
        if ids is not None and len(ids) > len(lps):
            ids = ids[: len(lps)]
    return ids, lps


def _echoed(c: dict[str, Any]) -> int:
    """How many of a completions choice's ``logprobs`` entries are the echoed prompt's."""
    lp = c.get("logprobs")
    values = lp.get("token_logprobs") if isinstance(lp, dict) else None
    # Only an echo starts with a token that has no log-probability (the prompt's first).
    if not (isinstance(values, list) and values and values[0] is None):
        return 0
    for key in ("prompt_token_ids", "prompt_logprobs"):
        if isinstance(c.get(key), list):
            return len(c[key])
    return len(values)  # the split is unknown: claim none of them for the completion


def choices_of(data: dict[str, Any], endpoint: str) -> list[ChoiceCapture]:
    """The captures of a whole (non-streamed) answer."""
    out = []
    for c in _choices(data):
        if endpoint == "chat":
            message = c.get("message")
            ids = c.get("token_ids")
            lps = sampled_logprobs(c.get("logprobs"))
        else:
            message = {"text": c.get("text")}
            ids, lps = _own_tokens(c)
        out.append(
            ChoiceCapture(
                index=_index(c),
                message=message if isinstance(message, dict) else None,
                token_ids=ids,
                logprobs=lps,
                finish_reason=c.get("finish_reason"),
            )
        )
    return out


class _Assembly:
    """One streamed choice being put back together."""

    __slots__ = ("content", "finish", "logprobs", "role", "token_ids", "tools")

    def __init__(self) -> None:
        self.role = "assistant"
        self.content: list[str] = []
        self.tools: dict[int, dict[str, Any]] = {}
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.finish: str | None = None

    def add_delta(self, delta: dict[str, Any]) -> None:
        content = delta.get("content")
        if isinstance(content, str):
            self.content.append(content)
        for tc in delta.get("tool_calls") or ():
            slot = self.tools.setdefault(
                int(tc.get("index") or 0),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            if tc.get("id"):
                slot["id"] = tc["id"]
            fn = tc.get("function") or {}
            if fn.get("name"):
                slot["function"]["name"] += fn["name"]
            if fn.get("arguments"):
                slot["function"]["arguments"] += fn["arguments"]

    def capture(self, index: int, endpoint: str) -> ChoiceCapture:
        text = "".join(self.content)
        if endpoint == "chat":
            message: dict[str, Any] = {"role": self.role, "content": text or None}
            if self.tools:
                message["tool_calls"] = [self.tools[i] for i in sorted(self.tools)]
        else:
            message = {"text": text}
        return ChoiceCapture(index, message, self.token_ids, self.logprobs, self.finish)


class StreamCapture:
    """Feed it every SSE event of a stream; it rewrites events and assembles the answer."""

    def __init__(self, endpoint: str, wants: Wants) -> None:
        self.endpoint = endpoint
        self.wants = wants
        self.prompt_token_ids: list[int] | RawJson | None = None
        self.model: str | None = None
        self._choices: dict[int, _Assembly] = {}

    def on_event(self, event: bytes) -> bytes:
        """Record one ``data: {...}`` event and return it as the client should see it
        (``b""``: the client's own request would not have produced it). Each event is
        parsed once, its choices walked once, and it is written again only when
        something in it changed."""
        cut = None
        raw = event[5:]
        if self.endpoint == "chat" and self.prompt_token_ids is None:  # the first chunk's
            raw, cut = cut_prompt_ids(raw)
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return event  # not ours to judge; the client gets it as it came
        if not isinstance(data, dict):
            return event
        if cut is not None:
            data["prompt_token_ids"] = cut
        if self.model is None and isinstance(data.get("model"), str):
            self.model = data["model"]
        self._note_prompt(data)
        wants = self.wants
        choices = _choices(data)
        # vLLM echoes the prompt in the first chunk of each completions choice.
        echo_chunks = (
            {_index(c) for c in choices if _index(c) not in self._choices} if wants.echo else ()
        )
        if wants.logprobs and wants.token_ids:
            for c in choices:
                self._add(c, _index(c))
            return event
        changed = not wants.token_ids and _null(data, "prompt_token_ids")
        # a chat chunk vLLM sent only for the token ids or log-probabilities that capture
        # asked for (a token that yields no delta, such as a tool-call tag): not the client's
        only_capture = self.endpoint == "chat" and not wants.token_ids and bool(choices)
        for c in choices:
            i = _index(c)
            self._add(c, i)
            echo = i in echo_chunks
            changed = _hide_choice(c, wants, echo=echo) or changed
            if only_capture and (c.get("delta") != {} or c.get("finish_reason") is not None):
                only_capture = False
            if echo:
                changed = _restore_echo(c, wants) or changed
        if only_capture and not wants.logprobs:
            return b""
        if not changed:
            return event
        return b"data: " + orjson.dumps(data, default=as_written) + b"\n\n"

    def _note_prompt(self, data: dict[str, Any]) -> None:
        if self.prompt_token_ids is not None:
            return
        found = data.get("prompt_token_ids")  # chat: at the top; completions: per choice
        if not isinstance(found, list | RawJson):
            found = next(
                (c["prompt_token_ids"] for c in _choices(data)
                 if isinstance(c.get("prompt_token_ids"), list)),
                None,
            )  # fmt: skip
        self.prompt_token_ids = found

    def _add(self, c: dict[str, Any], index: int) -> None:
        a = self._choices.get(index)
        if a is None:
            a = self._choices[index] = _Assembly()
        if self.endpoint == "chat":
            delta = c.get("delta")
            if delta:
                a.add_delta(delta)
            ids = c.get("token_ids")
            lps = sampled_logprobs(c.get("logprobs"))
        else:
            if isinstance(c.get("text"), str):
                a.content.append(c["text"])
            ids, lps = _own_tokens(c)
        if isinstance(ids, list):
            a.token_ids.extend(ids)
        if lps:
            a.logprobs.extend(lps)
        finish = c.get("finish_reason")
        if finish:
            a.finish = finish

    def choices(self) -> list[ChoiceCapture]:
        return [self._choices[i].capture(i, self.endpoint) for i in sorted(self._choices)]
