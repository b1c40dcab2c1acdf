"""What the router derives from one request's body, each part computed once, on first use.

A chain of policies (session -> rules -> classifier) looks at the same request several
times, and the gateway needs some of the same numbers after the decision: the prompt-token
estimate it learns from when the tier reports its count, and where the conversation ends,
which the session's next step is sized from. ``RouteRequest.analysis`` holds one
``Analysis`` per request and every policy's ``Decision.analysis`` carries it back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from router.step_features import Step, analyse
from router.tokens import DEFAULT, Anchor, Counts, TokenModel, anchored, counts, position


class Analysis:
    """The request's prompt counts, prompt-token estimate, step features and position.

    Reading a property computes it the first time and returns the same object afterwards
    (two threads reading it at once may both compute it; the results are equal)."""

    __slots__ = (
        "_anchor", "_body", "_counts", "_position", "_positioned", "_prompt_tokens", "_step",
        "_tokens",
    )  # fmt: skip

    def __init__(
        self,
        body: Mapping[str, Any],
        tokens: TokenModel | None = None,
        anchor: Anchor | None = None,
    ) -> None:
        self._body = body
        self._tokens = tokens or DEFAULT
        self._anchor = anchor
        self._counts: Counts | None = None
        self._prompt_tokens: tuple[int, bool] | None = None
        self._step: Step | None = None
        self._position: tuple[int, int] | None = None
        self._positioned = False

    @property
    def counts(self) -> Counts:
        """What the prompt-token estimate is made of (``router.tokens.counts``)."""
        if self._counts is None:
            self._counts = counts(self._body)
        return self._counts

    @property
    def prompt_tokens(self) -> tuple[int, bool]:
        """(the prompt tokens the tier will read, whether they were sized from the session's
        last exact count): ``router.tokens.anchored`` with the request's token model."""
        if self._prompt_tokens is None:
            self._prompt_tokens = anchored(self._tokens, self.counts, self._body, self._anchor)
        return self._prompt_tokens

    @property
    def step(self) -> Step:
        """The step's structural features (``router.step_features``), sized by
        ``prompt_tokens``."""
        if self._step is None:
            self._step = analyse(self._body, self._tokens, self.counts, self.prompt_tokens[0])
        return self._step

    @property
    def position(self) -> tuple[int, int] | None:
        """Where a chat conversation ends (``router.tokens.position``); None for a
        completions request or no messages."""
        if not self._positioned:
            self._position, self._positioned = position(self._body), True
        return self._position
