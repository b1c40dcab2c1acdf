"""Structural features of one agent step, from the request alone (no tokenizer, no I/O).

What the router needs beyond prompt length: where the step sits in a tool loop, whether
the last tool call failed, whether the step is about code or math (which pruned models
lose first, REFERENCES.md), what the client asked for (structured output, a token budget,
a reasoning effort). Every value is a float so a policy, a classifier or a log can use the
same mapping; ``Decision.features`` carries them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from router.tokens import DEFAULT, LISTS, MAPS, Counts, TokenModel, counts

# Cheap substring tests first (C speed), and bounded patterns only after a hint matched: a
# hostile request must not be able to make a decision slow. The tests also see only SCAN
# characters at each end of the user's text, so a decision stays cheap whatever its size.
CODE_HINTS = ("```", "def ", "class ", "import ", "#include", "function", "=>", "SELECT")
CODE = re.compile(
    r"```|\bdef \w{1,64}\(|\bclass \w{1,64}[:(]|\bimport \w|#include\b|\bfunction\s{0,8}\("
    r"|=>|\bSELECT\b[^;]{0,80}?\bFROM\b"
)
MATH_HINTS = (
    "\\frac",
    "\\int",
    "\\sum",
    "\\sqrt",
    "prove",
    "integral",
    "derivative",
    "equation",
    "theorem",
)
DOLLARS = re.compile(r"\$[^$\n]{1,200}\$")
ARITHMETIC = re.compile(r"\d[ ]{0,4}[-+*/^][ ]{0,4}\d")
# a tool result that starts as an error does, or holds an "error" key (one C pass over the
# lower-cased text finds whether it may, before the pattern looks)
TOOL_ERROR_START = re.compile(r"\s{0,16}(error|traceback|exception|permission denied)", re.I)
TOOL_ERROR_KEY = re.compile(r"\"error\"\s{0,4}:")
SCAN = 2048


def has_code(text: str) -> bool:
    return any(h in text for h in CODE_HINTS) and CODE.search(text) is not None


def has_math(text: str) -> bool:
    low = text.lower()
    if any(h in low for h in MATH_HINTS):
        return True
    if "$" in text and DOLLARS.search(text):
        return True
    return ARITHMETIC.search(text) is not None


def tool_error(text: str) -> bool:
    """Whether a tool result (its first SCAN characters) reads as a failure."""
    text = text[:SCAN]
    if TOOL_ERROR_START.match(text) is not None:
        return True
    low = text.lower()
    return '"error"' in low and TOOL_ERROR_KEY.search(low) is not None


@functools.lru_cache(maxsize=1024)
def _code_math(text: str) -> tuple[bool, bool]:
    """``has_code`` and ``has_math`` of a user message, kept by its text: an agent's steps
    share their last user message (the task) while its tool loop runs."""
    return has_code(text), has_math(text)


EFFORT = {"minimal": 0.0, "low": 0.0, "medium": 1.0, "high": 2.0}


def _text(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, LISTS):
        texts = (p.get("text") for p in content if isinstance(p, MAPS))
        return " ".join(t for t in texts if isinstance(t, str))
    return ""


def _ends(text: str) -> str:
    """SCAN characters at each end of ``text``."""
    return text if len(text) <= 2 * SCAN else text[:SCAN] + "\n" + text[-SCAN:]


@dataclass(frozen=True, slots=True)
class Turns:
    """What ``analyse`` reads of a chat request's messages, one message after another, like
    ``tokens.Sums``: a session's next step extends its last step's turns with the messages
    it appends (``router.analysis.Tally``)."""

    messages: int = 0
    user_turns: int = 0
    user: str | None = None  # the last user message's text (``_ends``); None: none yet
    depth: int = 0  # assistant messages with tool calls after the last user message
    tool: object = None  # the content of the last tool message after it (None: none)

    def extended(self, messages: Iterable[Any]) -> Turns:
        """The turns of the messages read so far followed by ``messages``."""
        n, users, depth, tool = self.messages, self.user_turns, self.depth, self.tool
        last_user: Mapping[str, Any] | None = None
        for m in messages:
            if not isinstance(m, MAPS):
                continue
            n += 1
            role = m.get("role")
            if role == "user":
                users, last_user, depth, tool = users + 1, m, 0, None
            elif role == "assistant" and m.get("tool_calls"):
                depth += 1
            elif role == "tool":
                tool = m.get("content")
        user = self.user if last_user is None else _ends(_text(last_user.get("content")))
        return Turns(n, users, user, depth, tool)


@dataclass(frozen=True, slots=True)
class Step:
    features: dict[str, float]
    text: str  # the last user message (or the completions prompt), SCAN characters at each end
    counts: Counts  # what the prompt-token estimate is made of (``router.tokens``)


def step_features(body: Mapping[str, Any], tokens: TokenModel | None = None) -> dict[str, float]:
    return analyse(body, tokens).features


def analyse(
    body: Mapping[str, Any],
    tokens: TokenModel | None = None,
    sizes: Counts | None = None,
    prompt_tokens: int | None = None,
    turns: Turns | None = None,
) -> Step:
    """The step's features; ``tokens`` estimates its prompt tokens (``router.tokens``)
    unless the caller knows them better (``prompt_tokens``: ``Analysis.prompt_tokens``);
    ``turns``: its messages' ``Turns`` when the caller has them."""
    if turns is None:
        messages = body.get("messages")
        turns = Turns().extended(messages if isinstance(messages, LISTS) else ())
    prompt = body.get("prompt")
    if turns.user is not None:
        user_text = turns.user
    else:
        user_text = _ends(prompt) if isinstance(prompt, str) else ""
    sizes = counts(body) if sizes is None else sizes
    if prompt_tokens is None:
        prompt_tokens = (tokens or DEFAULT).estimate_counts(sizes)
    fmt = body.get("response_format")
    choice = body.get("tool_choice")
    limit = body.get("max_completion_tokens") or body.get("max_tokens")
    return Step({
        "prompt_tokens": float(prompt_tokens),
        "messages": float(turns.messages),
        "user_turns": float(turns.user_turns),
        "tools_offered": float(len(body.get("tools") or ())),
        "tool_loop_depth": float(turns.depth),
        "last_tool_error": float(tool_error(_text(turns.tool))),
        "code": float(_code_math(user_text)[0]),
        "math": float(_code_math(user_text)[1]),
        "structured_output": float(fmt is not None and isinstance(fmt, MAPS) and fmt.get("type") in ("json_schema", "json_object")),
        "forced_tool": float(choice == "required" or (choice is not None and isinstance(choice, MAPS))),
        "max_tokens": float(limit) if isinstance(limit, int) else 0.0,
        "reasoning_effort": EFFORT.get(str(body.get("reasoning_effort")), 0.0),
    }, user_text, sizes)  # fmt: skip
