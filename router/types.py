"""Value objects shared by every routing policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, TypeAlias

from router.analysis import Analysis, Tally
from router.tokens import Anchor, TokenModel

Endpoint: TypeAlias = Literal["chat", "completions"]  # the OpenAI endpoint a request came to


class Tier(StrEnum):
    """The two tiers of one model family."""

    FULL = "full"
    FAST = "fast"

    @property
    def other(self) -> Tier:
        return Tier.FAST if self is Tier.FULL else Tier.FULL


@dataclass(frozen=True, slots=True)
class SessionState:
    """What the gateway remembers of an agent session's earlier steps (``router.session``)."""

    steps: int = 0
    last_tier: Tier | None = None
    fast_failures: int = 0  # fast-tier steps that were escalated or failed upstream
    escalations: int = 0
    last_failure_step: int | None = None  # ``steps`` when the last fast-tier failure happened
    anchor: Anchor | None = None  # the last routed step's exact prompt size (router.tokens)


@dataclass(frozen=True, slots=True)
class LoadSignals:
    """The tiers' load as the gateway sees it: requests queued or running per replica
    (vLLM's gauges plus the gateway's in-flight count) and the fast tier's recent
    speculative-decoding acceptance rate (None until measured)."""

    queue_per_replica: Mapping[Tier, float] = field(default_factory=dict)
    acceptance_rate: Mapping[Tier, float | None] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a policy may look at: the request body as the client sent it, the session's
    history and the tiers' load.

    ``body`` is the decoded JSON of a chat or completions request; policies must
    treat it as read-only. ``session_id`` is the client's ``X-Session-Id`` (or
    ``user``), or a hash of the session's first messages when it gave none.
    """

    endpoint: Endpoint
    body: Mapping[str, Any]
    session_id: str | None = None
    session: SessionState | None = None
    load: LoadSignals | None = None
    # prompt-token estimate fitted to the serving tier's tokenizer and template (None: the
    # default family's, ``router.tokens.DEFAULT``)
    tokens: TokenModel | None = None
    # the tally of the session's last step (``router.analysis.Tally``, kept by the gateway):
    # when ``body`` resends that step's messages, only the messages it appends are read
    prior: Tally | None = field(default=None, compare=False, repr=False)
    # what policies derive from ``body``, computed once per request however many policies
    # of a chain look at it (``router.analysis``); built here, never passed in
    analysis: Analysis = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        anchor = self.session.anchor if self.session is not None else None
        object.__setattr__(self, "analysis", Analysis(self.body, self.tokens, anchor, self.prior))


@dataclass(frozen=True, slots=True)
class Decision:
    """A routing decision and why it was taken.

    ``propensity`` is the probability the policy gave to the tier it chose
    (1.0 for a deterministic policy); offline evaluation of other policies
    from recorded trajectories needs it. ``analysis`` is the request's
    (``RouteRequest.analysis``), carried back so that the caller reads the prompt counts,
    token estimate and position the policy used without computing them again (None for a
    decision taken without a request, such as the gateway's fallback on a policy error).
    """

    tier: Tier
    reason: str
    policy: str
    propensity: float = 1.0
    features: Mapping[str, float] = field(default_factory=dict)
    score: float | None = None  # a scoring policy's P(the step needs the full tier)
    threshold: float | None = None  # the score at and above which it chose full
    analysis: Analysis | None = field(default=None, compare=False, repr=False)
