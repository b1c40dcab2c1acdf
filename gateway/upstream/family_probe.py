"""The same-family contract checked against running replicas, through vLLM's ``/tokenize``.

Works for any replica, local or remote: one replica per tier tokenizes the same plain text
(the tokenizer) and the same conversation with tools and a tool call rendered by its chat
template (the template); the token ids must be identical. The tool-call parser cannot be
observed from outside, so it is compared as configured (``tiers.<tier>.tool_call_parser``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

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


async def _tokens(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> list[int]:
    async with session.post(url + "/tokenize", json=body) as resp:
        data = await resp.json(content_type=None)
        if resp.status != 200:
            raise RuntimeError(f"{url}/tokenize answered {resp.status}: {str(data)[:200]}")
        tokens: list[int] = data["tokens"]
        return tokens


async def check_replica_family(
    tiers: Mapping[Tier, TierSettings], timeout_s: float = 30.0
) -> list[str]:
    """Differences between the tiers' first replicas (empty when they are one family)."""
    if len(tiers) < 2:
        return []
    seen: dict[Tier, tuple[list[int], list[int]]] = {}
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_s)) as session:
        for tier, ts in tiers.items():
            if not ts.replicas:
                continue
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
            seen[tier] = (text, chat)
    problems = []
    (first, (text0, chat0)), *others = seen.items()
    for tier, (text, chat) in others:
        if text != text0:
            problems.append(
                f"the tokenizer of {tier} differs from {first}'s (same text, different token ids)"
            )
        if chat != chat0:
            problems.append(
                f"the chat template of {tier} differs from {first}'s (same conversation, different prompt)"
            )
    parsers = {tier: ts.tool_call_parser for tier, ts in tiers.items()}
    if len(set(parsers.values())) > 1:
        problems.append(f"tool-call parsers differ: {parsers}")
    return problems
