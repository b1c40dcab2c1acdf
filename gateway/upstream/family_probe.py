"""The same-family contract checked against running replicas, through vLLM's ``/tokenize``.

Works for any replica, local or remote: one replica per tier tokenizes the same plain text
(the tokenizer) and the same conversation with tools and a tool call rendered by its chat
template (the template); the token ids must be identical. The tool-call parser cannot be
observed from outside, so it is compared as configured (``tiers.<tier>.tool_call_parser``).

A replica that does not answer ``/tokenize`` in vLLM's shape (unreachable, slow, an error
status, not JSON, no list of token ids) is a problem named like any difference, never an
exception: `serve` decides, per tier (``tiers.<tier>.family_check``), whether it stops.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from gateway.config import TierSettings
from router.types import Tier

PROBE_TEXT = "Gearshift family probe: naïve café, 東京, emoji 🚀, code `x = f(3) ** 2`, tabs\tand\nnew lines."
PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
PROBE_MESSAGES = [
    {"role": "system", "content": "You are a careful assistant."},
    {"role": "user", "content": "What is the weather in Paris?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 18}'},
]


@dataclass(frozen=True)
class FamilyProblem:
    """One reason the tiers are not shown to be one family, and the tiers it concerns."""

    message: str
    tiers: tuple[Tier, ...]

    def required(self, tiers: Mapping[Tier, TierSettings]) -> bool:
        """Whether it stops start-up: not when a tier it concerns says ``family_check: warn``."""
        return all(tiers[t].family_check == "required" for t in self.tiers)


class _ProbeFailed(Exception):
    """A replica's ``/tokenize`` answer was not vLLM's; the message says what was wrong."""


def _excerpt(raw: bytes) -> str:
    return repr(raw[:200].decode("utf-8", "replace"))


async def _tokens(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[int]:
    try:
        async with session.post(url + "/tokenize", json=body) as resp:
            status, raw = resp.status, await resp.read()
    except TimeoutError:  # before ClientError: aiohttp's timeouts are both
        raise _ProbeFailed(f"did not answer within {session.timeout.total:g} s") from None
    except aiohttp.ClientError as exc:
        raise _ProbeFailed(f"failed: {type(exc).__name__}: {exc}") from None
    if status != 200:
        raise _ProbeFailed(f"answered HTTP {status}: {_excerpt(raw)}")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise _ProbeFailed(f"answered with something other than JSON: {_excerpt(raw)}") from None
    tokens = data.get("tokens") if isinstance(data, dict) else None
    if not isinstance(tokens, list) or not all(type(t) is int for t in tokens):
        raise _ProbeFailed(
            f"answered without a list of token ids in 'tokens' (not vLLM's /tokenize): "
            f"{_excerpt(raw)}"
        )
    return tokens


async def _probe(session: aiohttp.ClientSession, ts: TierSettings) -> tuple[list[int], list[int]]:
    """The tier's first replica's token ids for the probe text and the probe conversation."""
    url = ts.replicas[0]
    text = await _tokens(session, url, {"model": ts.model, "prompt": PROBE_TEXT})
    chat = await _tokens(
        session,
        url,
        {
            "model": ts.model,
            "messages": PROBE_MESSAGES,
            "tools": PROBE_TOOLS,
            "add_generation_prompt": True,
        },
    )
    return text, chat


def _differences(seen: dict[Tier, tuple[list[int], list[int]]]) -> list[FamilyProblem]:
    if not seen:
        return []
    problems = []
    (first, (text0, chat0)), *others = seen.items()
    for tier, (text, chat) in others:
        if text != text0:
            message = (
                f"the tokenizer of {tier} differs from {first}'s (same text, different token ids)"
            )
            problems.append(FamilyProblem(message, (first, tier)))
        if chat != chat0:
            message = f"the chat template of {tier} differs from {first}'s (same conversation, different prompt)"
            problems.append(FamilyProblem(message, (first, tier)))
    return problems


async def family_problems(
    tiers: Mapping[Tier, TierSettings], timeout_s: float = 30.0
) -> list[FamilyProblem]:
    """Differences between the tiers' first replicas, and replicas that could not be probed
    (empty when the tiers are one family). Never raises for what a replica answers."""
    if len(tiers) < 2:
        return []
    problems: list[FamilyProblem] = []
    seen: dict[Tier, tuple[list[int], list[int]]] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        for tier, ts in tiers.items():
            if not ts.replicas:
                continue
            try:
                seen[tier] = await _probe(session, ts)
            except _ProbeFailed as exc:
                message = f"tier {tier}: replica {ts.replicas[0]}: POST /tokenize {exc}"
                problems.append(FamilyProblem(message, (tier,)))
    problems += _differences(seen)
    parsers = {tier: ts.tool_call_parser for tier, ts in tiers.items()}
    if len(set(parsers.values())) > 1:
        problems.append(FamilyProblem(f"tool-call parsers differ: {parsers}", tuple(parsers)))
    return problems


async def check_replica_family(
    tiers: Mapping[Tier, TierSettings], timeout_s: float = 30.0
) -> list[str]:
    """What `family_problems` finds, as messages (empty when the tiers are one family)."""
    return [p.message for p in await family_problems(tiers, timeout_s)]
