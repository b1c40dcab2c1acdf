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

import heapq
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
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        params = fn.get("parameters") if isinstance(fn, Mapping) else None
        props = params.get("properties") if isinstance(params, Mapping) else None
        if isinstance(props, Mapping):
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
    text = _ends(step.text, TEXT_SCAN)
    numbers = NUMBER.findall(text)
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
        "log_numbers": math.log1p(len(numbers)),
        "log_long_numbers": math.log1p(sum(1 for n in numbers if len(n) >= 3)),
        "log_words": math.log1p(len(text.split())),
        "log_tool_params": math.log1p(_tool_params(body)),
        "session_fast_failures": float(min(session.fast_failures, 3)) if session else 0.0,
        "session_escalations": float(min(session.escalations, 3)) if session else 0.0,
    }
    return x, raw


def ngrams(body: Mapping[str, Any], step: Step | None = None) -> set[str]:
    """The unigrams and bigrams of the last user message that the classifier hashes."""
    text = (step or analyse(body)).text
    tokens = _ends(text, TEXT_SCAN).lower().translate(TOKENIZE).split()
    grams = set(tokens)
    grams.update(map(" ".join, itertools.pairwise(tokens)))
    return grams


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
        contributions = [
            (name, self.dense[name] * standardize(x[name], self.mean[name], self.scale[name]))
            for name in DENSE
        ]
        grams = ngrams(body, step)
        if grams:
            weight = 1.0 / math.sqrt(len(grams))
            mask = (1 << self.bits) - 1
            hashed = self.hashed
            for gram in grams:
                w = hashed.get(zlib.crc32(gram.encode()) & mask)
                if w:
                    contributions.append(("text:" + gram, w * weight))
        # fsum is exact, so the result does not depend on the (hash-seeded) order of the set
        z = math.fsum([self.bias, *(c for _, c in contributions)])
        p = 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))
        top = heapq.nsmallest(3, contributions, key=lambda kv: (-abs(kv[1]), kv[0]))
        return Prediction(p, tuple((k, round(v, 3)) for k, v in top), {**raw, **x})
