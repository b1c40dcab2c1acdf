"""Exact-answer scoring: the answer must be the expected one, not merely contain it.

``exact_answer_score("0", "It freezes at 100 degrees")`` is 0: a substring test would count
the "0" inside "100". Both texts are normalised to tokens first — lower case, accents and
punctuation dropped, "a"/"an"/"the" dropped, number words up to ninety-nine written as
digits ("seven" is "7", "twenty-one" is "21"), numbers without thousands separators or a
trailing ".0" ("1,000.0" is "1000") — and the expected tokens must equal one of these
answer spans:

* the whole answer, or its first line ("Paris" / "Paris.\\nIt is the capital...");
* the last tokens of the answer's first sentence, as many as the expected answer has
  ("The capital of France is Paris." ends in "paris"; "Paris is the capital of France." does
  not, and scores 0: the scorer does not guess where an answer hides);
* for a numeric expected answer, the last number in the answer ("The answer is 4." is 4).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from typing import Any

UNITS = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen",
]  # fmt: skip
TENS = {"twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70,
        "eighty": 80, "ninety": 90}  # fmt: skip
NUMBER_WORDS = {word: str(i) for i, word in enumerate(UNITS)} | {k: str(v) for k, v in TENS.items()}
ARTICLES = frozenset(("a", "an", "the"))
# a number (optional sign, thousands separators, decimals) or a run of letters/digits
TOKEN = re.compile(r"-?\d[\d,]*(?:\.\d+)?|[a-z0-9]+")
SENTENCE_END = re.compile(r"(?<=[a-z0-9])[.!?](?:\s|$)|\n")


def _number(token: str) -> str:
    """'1,000.50' -> '1000.5', '4.0' -> '4', '-0' -> '0'."""
    text = token.replace(",", "")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    if text in ("-0", ""):
        return "0"
    return text


def tokens(text: str) -> list[str]:
    """Normalised tokens of ``text`` (see the module docstring)."""
    plain = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    plain = re.sub(r"\b(" + "|".join(TENS) + r")[- ](" + "|".join(UNITS[1:10]) + r")\b",
                   lambda m: str(TENS[m.group(1)] + UNITS.index(m.group(2))), plain)  # fmt: skip
    out = []
    for tok in TOKEN.findall(plain):
        if tok in ARTICLES:
            continue
        if tok[0].isdigit() or tok[0] == "-":
            out.append(_number(tok))
        else:
            out.append(NUMBER_WORDS.get(tok, tok))
    return out


def _is_number(token: str) -> bool:
    return re.fullmatch(r"-?\d+(?:\.\d+)?", token) is not None


def exact_answer_score(expected: str, answer: str) -> float:
    """1.0 when ``answer`` gives exactly ``expected`` (normalised), else 0.0."""
    want = tokens(expected)
    if not want:
        raise ValueError(f"expected answer {expected!r} has no words or numbers")
    text = answer.strip()
    first_line = text.splitlines()[0] if text else ""
    first_sentence = SENTENCE_END.split(text.lower(), maxsplit=1)[0] if text else ""
    spans = [tokens(text), tokens(first_line), tokens(first_sentence)[-len(want) :]]
    if len(want) == 1 and _is_number(want[0]):
        numbers = [t for t in tokens(text) if _is_number(t)]
        if numbers:
            spans.append(numbers[-1:])
    return float(want in spans)


def exact_answer(expected: str) -> Callable[[dict[str, Any]], float]:
    """A task checker: the assistant message's content scored by ``exact_answer_score``."""
    if not tokens(expected):  # fail when the task is defined, not on every answer
        raise ValueError(f"expected answer {expected!r} has no words or numbers")
    return lambda message: exact_answer_score(expected, message.get("content") or "")
