"""The trained complexity classifier: P(this step needs the full tier), in pure Python.

A logistic regression over two kinds of features, both computed from the request alone in
well under a millisecond (``bench.router_latency``):

* dense: the structural step features (``router.step_features``; not ``max_tokens``, which
  in the evaluation set identifies the source and would be learned as such), a few counts
  that track difficulty (numbers and long numbers in the user's text, its words, the offered
  tools' parameters), and the session's history (fast-tier failures and escalations so far),
  standardized and clipped to 3 standard deviations;
* hashed text: lower-cased word unigrams and bigrams of the last user message (digits
  become 0, so a number's token is its shape, ``2024`` -> ``0000``; punctuation separates
  words), hashed with CRC-32 into ``2**hash_bits`` buckets; only ``TEXT_SCAN`` characters
  at each end are read.

The model is a small JSON file (``router/assets/classifier.json``) written by
``gearshift router train`` (``router.training``); it records how it was trained and its
held-out figures. Nothing here loads an encoder or calls the network.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import re
import string
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router.step_features import Step, analyse
from router.tokens import MAPS
from router.types import SessionState

DEFAULT_MODEL = Path(__file__).parent / "assets" / "classifier.json"  # greedy outcomes
DEFAULT_SAMPLED_MODEL = Path(__file__).parent / "assets" / "classifier-sampled.json"  # T=0.7
FORMAT = "gearshift-router-logreg/1"
CLIP = 3.0  # standard deviations
TEXT_SCAN = 1024  # characters read at each end of the user's text for n-grams
# one C pass: digits become 0 (a number's shape is its length: 2024 -> 0000), punctuation a space
TOKENIZE = str.maketrans(
    string.digits + string.punctuation, "0" * 10 + " " * len(string.punctuation)
)
NUMBER = re.compile(r"\d+")

DENSE = (
    "log_prompt_tokens", "log_messages", "user_turns", "log_tools_offered", "tool_loop_depth",
    "last_tool_error", "code", "math", "structured_output", "forced_tool", "tool_choice_auto",
    "reasoning_effort", "log_numbers", "log_long_numbers", "log_words",
    "log_tool_params", "session_fast_failures", "session_escalations",
)  # fmt: skip
MAX_TOOLS = 64  # tools inspected for their parameter count


def _tool_params(body: Mapping[str, Any]) -> int:
    tools = body.get("tools")
    if not isinstance(tools, Sequence) or isinstance(tools, str):
        return 0
    total = 0
    for tool in tools[:MAX_TOOLS]:
        fn = tool.get("function") if isinstance(tool, MAPS) else None
        params = fn.get("parameters") if isinstance(fn, MAPS) else None
        props = params.get("properties") if isinstance(params, MAPS) else None
        if isinstance(props, MAPS):
            total += len(props)
    return total


def _ends(text: str, scan: int) -> str:
    return text if len(text) <= 2 * scan else text[:scan] + "\n" + text[-scan:]


def dense_features(
    body: Mapping[str, Any], session: SessionState | None = None, step: Step | None = None
) -> tuple[dict[str, float], dict[str, float]]:
    """(the classifier's dense inputs, the raw step features they come from); ``step`` is
    ``analyse(body)`` when the caller has it already."""
    step = step or analyse(body)
    raw = step.features
    numbers, long_numbers, words = _text_counts(step.text)
    choice = body.get("tool_choice")
    x = {
        "log_prompt_tokens": math.log1p(raw["prompt_tokens"]),
        "log_messages": math.log1p(raw["messages"]),
        "user_turns": min(raw["user_turns"], 10.0),
        "log_tools_offered": math.log1p(raw["tools_offered"]),
        "tool_loop_depth": min(raw["tool_loop_depth"], 10.0),
        "last_tool_error": raw["last_tool_error"],
        "code": raw["code"],
        "math": raw["math"],
        "structured_output": raw["structured_output"],
        "forced_tool": raw["forced_tool"],
        "tool_choice_auto": float(raw["tools_offered"] > 0 and choice in (None, "auto")),
        "reasoning_effort": raw["reasoning_effort"],
        "log_numbers": math.log1p(numbers),
        "log_long_numbers": math.log1p(long_numbers),
        "log_words": math.log1p(words),
        "log_tool_params": math.log1p(_tool_params(body)),
        "session_fast_failures": float(min(session.fast_failures, 3)) if session else 0.0,
        "session_escalations": float(min(session.escalations, 3)) if session else 0.0,
    }
    return x, raw


# An agent's steps share their last user message (the task) while its tool loop runs: what
# the classifier reads of that text is kept, by the text, for the steps after the first.
TEXT_CACHE = 1024


@functools.lru_cache(maxsize=TEXT_CACHE)
def _text_counts(text: str) -> tuple[int, int, int]:
    """(numbers, numbers of 3 digits or more, words) in ``text``'s ends."""
    text = _ends(text, TEXT_SCAN)
    numbers = NUMBER.findall(text)
    return len(numbers), sum(1 for n in numbers if len(n) >= 3), len(text.split())


def ngrams(body: Mapping[str, Any], step: Step | None = None) -> set[str]:
    """The unigrams and bigrams of the last user message that the classifier hashes."""
    return _ngrams((step or analyse(body)).text)


def _ngrams(text: str) -> set[str]:
    tokens = _ends(text, TEXT_SCAN).lower().translate(TOKENIZE).split()
    grams = set(tokens)
    grams.update(map(" ".join, itertools.pairwise(tokens)))
    return grams


Terms = tuple[tuple[str, float], ...]


def _top(contributions: Sequence[tuple[str, float]]) -> list[tuple[str, float]]:
    """The three largest contributions by size, ties by name: a total order, so the top
    three of a union are the top three of the parts' top threes."""
    return sorted(contributions, key=lambda kv: (-abs(kv[1]), kv[0]))[:3]


def bucket(gram: str, bits: int) -> int:
    return zlib.crc32(gram.encode()) & ((1 << bits) - 1)


def standardize(value: float, mean: float, scale: float) -> float:
    """(value - mean) / scale, clipped to CLIP: a request unlike anything in training (a
    one-word prompt, a 500-tool request) must not get an extreme score from one feature."""
    return max(-CLIP, min(CLIP, (value - mean) / scale))


@dataclass(frozen=True, slots=True)
class Prediction:
    probability: float  # P(needs the full tier)
    top: tuple[tuple[str, float], ...]  # the largest contributions to the logit, signed
    features: dict[str, float]  # the raw step features and dense inputs, for the record


def write_model(spec: Mapping[str, Any], path: Path) -> None:
    """Save a model spec (``router.training``) where ``Classifier.load`` reads it; a
    reader never sees a half-written file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
    os.replace(tmp, path)


class Classifier:
    """A trained model file, loaded once; ``predict`` is pure and deterministic."""

    def __init__(self, spec: Mapping[str, Any], source: str = "") -> None:
        self.source = source  # the file it came from, for messages
        if spec.get("format") != FORMAT:
            raise ValueError(
                f"not a Gearshift router model (format {spec.get('format')!r}, want {FORMAT!r})"
            )
        self.spec = dict(spec)
        try:
            self.bits = int(spec["hash_bits"])
            self.bias = float(spec["bias"])
            self.dense = {k: float(v) for k, v in spec["dense_weights"].items()}
            self.mean = {k: float(v) for k, v in spec["dense_mean"].items()}
            self.scale = {k: float(v) for k, v in spec["dense_scale"].items()}
            self.hashed = {int(k): float(v) for k, v in spec["hashed_weights"].items()}
            self.threshold = float(spec["threshold"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ValueError(f"router model is incomplete or malformed: {exc!r}") from None
        missing = set(DENSE) - set(self.dense) | set(DENSE) - set(self.mean)
        if missing:
            raise ValueError(f"router model lacks weights for {sorted(missing)}")
        # (name, weight, mean, scale) of each dense input, in DENSE's order, read per request
        self._rows = tuple((k, self.dense[k], self.mean[k], self.scale[k]) for k in DENSE)
        self._text_terms = functools.lru_cache(maxsize=TEXT_CACHE)(self._hashed_terms)

    def _hashed_terms(self, text: str) -> tuple[tuple[float, ...], Terms]:
        """The contributions to the logit of the hashed n-grams of ``text`` (the last user
        message); and the largest three of them (``_top``), named."""
        grams = _ngrams(text)
        if not grams:
            return (), ()
        weight = 1.0 / math.sqrt(len(grams))
        mask = (1 << self.bits) - 1
        hashed = self.hashed
        terms = []
        for gram in grams:
            w = hashed.get(zlib.crc32(gram.encode()) & mask)
            if w:
                terms.append(("text:" + gram, w * weight))
        return tuple(c for _, c in terms), tuple(_top(terms))

    @classmethod
    def load(cls, path: str | Path = DEFAULT_MODEL) -> Classifier:
        try:
            spec = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise ValueError(
                f"router model {path} does not exist; train one with `gearshift router train`"
            ) from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"router model {path} is not valid JSON: {exc}") from None
        return cls(spec, str(path))

    @property
    def fast_tier(self) -> dict[str, Any] | None:
        """The fast tier whose outcomes it learned from, when its training recorded it
        (``training.fast_tier``: model, mode and pruning of the embedded stack)."""
        training = self.spec.get("training")
        tier = training.get("fast_tier") if isinstance(training, Mapping) else None
        return dict(tier) if isinstance(tier, Mapping) else None

    def predict(
        self, body: Mapping[str, Any], session: SessionState | None = None, step: Step | None = None
    ) -> Prediction:
        step = step or analyse(body)
        x, raw = dense_features(body, session, step)
        text, text_top = self._text_terms(step.text)
        values = [self.bias]
        ranked = []  # (-|contribution|, name, contribution): ``_top``'s order, without a key
        for name, weight, mean, scale in self._rows:
            v = (x[name] - mean) / scale  # standardize(), inlined: the same comparisons
            v = v if v < CLIP else CLIP
            c = weight * (v if v > -CLIP else -CLIP)
            values.append(c)
            ranked.append((-abs(c), name, c))
        ranked += [(-abs(c), name, c) for name, c in text_top]  # the text's top 3 stand for all
        ranked.sort()  # names are unique: the order of (-|c|, name), as ``_top`` sorts
        # fsum is exact, so the result does not depend on the (hash-seeded) order of the set
        z = math.fsum([*values, *text])
        p = 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))
        top = tuple((name, round(c, 3)) for _, name, c in ranked[:3])
        return Prediction(p, top, {**raw, **x})
