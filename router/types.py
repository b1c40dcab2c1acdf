"""Value objects shared by every routing policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Tier(StrEnum):
    """The two tiers of one model family."""

    FULL = "full"
    FAST = "fast"

    @property
    def other(self) -> Tier:
        return Tier.FAST if self is Tier.FULL else Tier.FULL


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What a policy may look at: the request body as the client sent it.

    ``body`` is the decoded JSON of a chat or completions request; policies must
    treat it as read-only. ``session_id`` is the client's ``X-Session-Id`` (or
    ``user``) when it gave one.
    """

    endpoint: str  # "chat" | "completions"
    body: Mapping[str, Any]
    session_id: str | None = None


@dataclass(frozen=True, slots=True)
class Decision:
    """A routing decision and why it was taken.

    ``propensity`` is the probability the policy gave to the tier it chose
    (1.0 for a deterministic policy); offline evaluation of other policies
    from recorded trajectories needs it.
    """

    tier: Tier
    reason: str
    policy: str
    propensity: float = 1.0
    features: Mapping[str, float] = field(default_factory=dict)
