"""What the router derives from one request's body, each part computed once, on first use.

A chain of policies (session -> rules -> classifier) looks at the same request several
times, and the gateway needs some of the same numbers after the decision: the prompt-token
estimate it learns from when the tier reports its count, and where the conversation ends,
which the session's next step is sized from. ``RouteRequest.analysis`` holds one
``Analysis`` per request and every policy's ``Decision.analysis`` carries it back.

An agent resends its whole conversation at every step. What the counts and the features
read of the messages is summed message by message (``Tally``), so a step whose messages
begin with the session's last step's (the gateway keeps that step's tally) reads only the
messages it appends: the same counts and features, at a cost that does not grow with the
conversation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.step_features import Step, Turns, analyse
from router.tokens import (
    DEFAULT,
    NO_SUMS,
    Anchor,
    Counts,
    Sums,
    TokenModel,
    anchored,
    counts,
    position,
)

PER_MESSAGE = 256  # bytes a kept message costs beyond its text, about (``Tally.size``)


@dataclass(frozen=True, slots=True, eq=False)
class Tally:
    """What the router read of a chat request's messages (``tokens.Sums`` for the counts,
    ``step_features.Turns`` for the features), and the messages it read."""

    messages: list[Any]  # a copy of the request's list (its message objects)
    sums: Sums
    turns: Turns
    # the sums of the messages after the first ``base``, those ``extended`` read (None:
    # all of them were read, ``of``): what the session's anchor is sized up by
    base: int = 0
    added: Sums | None = None

    @classmethod
    def of(cls, messages: list[Any]) -> Tally:
        return cls(messages[:], Sums().extended(messages), Turns().extended(messages))

    def extended(self, messages: list[Any]) -> Tally | None:
        """The tally of ``messages`` when they begin with the messages read here (compared
        as the values they parse to, as ``gateway.store.chain`` compares histories): only
        the rest is read. None when they do not: a client that edited or compacted its
        history is read afresh."""
        n = len(self.messages)
        if len(messages) < n or messages[:n] != self.messages:
            return None
        if len(messages) == n:
            return self
        added = messages[n:]
        sums = NO_SUMS.extended(added)
        return Tally(messages[:], self.sums.joined(sums), self.turns.extended(added), n, sums)

    @property
    def size(self) -> int:
        """About the bytes the messages it keeps alive hold."""
        return self.sums.chars + self.sums.json_chars + PER_MESSAGE * len(self.messages)


class Analysis:
    """The request's prompt counts, prompt-token estimate, step features and position.

    Reading a property computes it the first time and returns the same object afterwards
    (two threads reading it at once may both compute it; the results are equal).
    ``prior``: the tally of the session's last step, which this one may extend."""

    __slots__ = (
        "_anchor", "_body", "_counts", "_position", "_positioned", "_prior", "_prompt_tokens",
        "_step", "_tallied", "_tally", "_tokens",
    )  # fmt: skip

    def __init__(
        self,
        body: Mapping[str, Any],
        tokens: TokenModel | None = None,
        anchor: Anchor | None = None,
        prior: Tally | None = None,
    ) -> None:
        self._body = body
        self._tokens = tokens or DEFAULT
        self._anchor = anchor
        self._prior = prior
        self._tally: Tally | None = None
        self._tallied = False
        self._counts: Counts | None = None
        self._prompt_tokens: tuple[int, bool] | None = None
        self._step: Step | None = None
        self._position: tuple[int, int] | None = None
        self._positioned = False

    @property
    def counts(self) -> Counts:
        """What the prompt-token estimate is made of (``router.tokens.counts``)."""
        if self._counts is None:
            tally = self.tally
            self._counts = counts(self._body, tally.sums if tally is not None else None)
        return self._counts

    @property
    def prompt_tokens(self) -> tuple[int, bool]:
        """(the prompt tokens the tier will read, whether they were sized from the session's
        last exact count): ``router.tokens.anchored`` with the request's token model."""
        if self._prompt_tokens is None:
            sizes, anchor, added = self.counts, self._anchor, None
            tally = self._tally
            if anchor is not None and tally is not None and tally.base == anchor.messages:
                added = tally.added  # the step's appended messages, read once
            self._prompt_tokens = anchored(self._tokens, sizes, self._body, anchor, added)
        return self._prompt_tokens

    @property
    def step(self) -> Step:
        """The step's structural features (``router.step_features``), sized by
        ``prompt_tokens``."""
        if self._step is None:
            tally = self.tally
            turns = tally.turns if tally is not None else None
            self._step = analyse(
                self._body, self._tokens, self.counts, self.prompt_tokens[0], turns
            )
        return self._step

    @property
    def tally(self) -> Tally | None:
        """The messages' tally: ``prior`` extended with the messages this request appends
        to prior's, else read afresh; None for a completions request."""
        if not self._tallied:
            messages = self._body.get("messages")
            if isinstance(messages, list):
                prior = self._prior
                extended = prior.extended(messages) if prior is not None else None
                self._tally = Tally.of(messages) if extended is None else extended
            self._tallied = True
        return self._tally

    @property
    def position(self) -> tuple[int, int] | None:
        """Where a chat conversation ends (``router.tokens.position``); None for a
        completions request or no messages."""
        if not self._positioned:
            self._position, self._positioned = position(self._body), True
        return self._position
