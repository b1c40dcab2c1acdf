"""What ``bench.context`` measures besides time and tokens: the answer's score, a
bootstrap interval over sessions, and vLLM's prefix-cache counters.

* ``score`` reads a model's answer the way a checker of a question for the number printed
  with ``<key>`` would (an error code and a file path too): ``exact`` when the whole answer,
  stripped of spaces, quotes and a final full stop, is the value; ``normalised`` when the
  first number (thousands separators removed), error code (``E4821``) or path
  (``dist/x-3fa9c1.tar``) in it is the value. A model that lists several is not credited
  for a later one.
* ``bootstrap_ci`` resamples sessions (one score per session) with a seeded generator;
  ``paired_ratio_ci`` resamples them for two arms together (a strategy's accuracy over
  ``none``'s, each draw the same sessions for both).
* ``Tally`` sums one strategy's run: times, tokens, the questions' scores per session (and
  per family of session), summaries, prefix reuse; ``Tally.row`` is its line of the table.
* ``extends`` compares a step's prompt token ids with the previous step's of the same
  session: whether it starts with all of them (the generation prompt at their end aside),
  and the share of them it starts with (what the engine's prefix cache can reuse).
* ``PrefixCache`` reads ``vllm:prefix_cache_hits`` and ``vllm:prefix_cache_queries``
  (tokens, summed over engines) from each engine's ``/metrics`` and, where the server
  runs with ``VLLM_SERVER_DEV_MODE=1``, empties the cache (``POST /reset_prefix_cache``)
  so that one arm's hits do not come from another arm's prompts of the same session.
"""

from __future__ import annotations

import random
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import httpx

NUMBER_RE = re.compile(r"\d[\d,]*")
# the first token of a kind's shape in an answer (bench.context_data's question kinds)
SHAPES = {
    "number": NUMBER_RE,
    "code": re.compile(r"\bE\d{4}\b"),
    "file": re.compile(r"[\w.-]+/[\w./-]*\.(?:tar|json|csv|log|txt|py)\b"),
}
METRIC_RE = re.compile(r"^vllm:prefix_cache_(hits|queries)(?:_total)?(?:\{[^}]*\})?\s+(\S+)$", re.M)


@dataclass(frozen=True)
class Score:
    exact: bool
    normalised: bool


def score(answer: str, value: str, kind: str = "number") -> Score:
    """The answer against the fact's value: a string of digits, an error code or a file's
    path (``kind``); ``normalised`` compares the first token of the kind's shape."""
    bare = answer.strip().rstrip(".").strip("\"'` ")
    first = SHAPES[kind].search(answer)
    token = first.group(0).replace(",", "") if first else ""
    return Score(exact=bare == value, normalised=token == value)


def bootstrap_ci(
    outcomes: Sequence[float], *, rounds: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """The 95% percentile interval of the mean of ``outcomes`` (one per session: a bool,
    or the share of its questions answered)."""
    if not outcomes:
        return (0.0, 0.0)
    rng, n = random.Random(seed), len(outcomes)
    means = sorted(sum(rng.choices(outcomes, k=n)) / n for _ in range(rounds))
    return (round(means[int(0.025 * rounds)], 3), round(means[int(0.975 * rounds) - 1], 3))


def paired_ratio_ci(
    mine: Sequence[float], base: Sequence[float], *, rounds: int = 2000, seed: int = 0
) -> tuple[float, float] | None:
    """The 95% percentile interval of ``sum(mine) / sum(base)`` over sessions resampled
    with replacement, both arms' scores of a session drawn together (``mine[i]`` and
    ``base[i]``: session ``i``). None where it is undefined: no session, the two arms
    scored on different sessions, or ``base`` right on nothing; a draw whose ``base`` is
    right on nothing has no ratio and is left out."""
    n = len(base)
    if n == 0 or len(mine) != n or not any(base):
        return None
    rng, sessions = random.Random(seed), range(n)
    ratios = []
    for _ in range(rounds):
        drawn = rng.choices(sessions, k=n)
        below = sum(base[i] for i in drawn)
        if below:
            ratios.append(sum(mine[i] for i in drawn) / below)
    ratios.sort()
    k = len(ratios)
    return (round(ratios[int(0.025 * k)], 3), round(ratios[max(0, int(0.975 * k) - 1)], 3))


GENERATION_TAIL = 8  # the chat template's generation prompt (``<|im_start|>assistant\n``)
# ends a prompt; the next step's prompt has its next message there


def extends(previous: list[int], ids: list[int]) -> tuple[bool, float]:
    """Whether ``ids`` starts with ``previous`` (all but its last ``GENERATION_TAIL``
    tokens), and the share of ``previous`` that ``ids`` starts with."""
    n = 0
    for a, b in zip(previous, ids, strict=False):
        if a != b:
            break
        n += 1
    whole = n >= len(previous) - GENERATION_TAIL
    return whole, round(n / len(previous), 4) if previous else 0.0


def parse_prefix_counters(text: str) -> tuple[float, float]:
    """(hits, queries) in tokens, summed over the engines a /metrics page lists."""
    totals = {"hits": 0.0, "queries": 0.0}
    for name, value in METRIC_RE.findall(text):
        totals[name] += float(value)
    return totals["hits"], totals["queries"]


class PrefixCache:
    """The prefix-cache counters of a set of vLLM servers (none for the mock upstream)."""

    def __init__(self, client: httpx.Client, engines: list[str]) -> None:
        self.client, self.engines = client, engines

    def counters(self) -> tuple[float, float]:
        hits = queries = 0.0
        for url in self.engines:
            resp = self.client.get(url + "/metrics")
            resp.raise_for_status()
            h, q = parse_prefix_counters(resp.text)
            hits, queries = hits + h, queries + q
        return hits, queries

    def reset(self) -> bool:
        """Empties every engine's prefix cache; False where a server does not offer it."""
        ok = True
        for url in self.engines:
            ok &= self.client.post(url + "/reset_prefix_cache").status_code == 200
        return ok


@dataclass
class Tally:
    """One strategy's figures over the sessions it ran (``row``: the table's line)."""

    ms: list[float] = field(default_factory=list)
    answer_ms: list[float] = field(default_factory=list)  # the questions' requests only
    prompt_tokens: list[int] = field(default_factory=list)
    # per session: the share of its early questions answered (normalised match)
    outcomes: list[float] = field(default_factory=list)
    end: list[bool] = field(default_factory=list)  # per session with an end task: its check
    by_family: dict[str, list[float]] = field(default_factory=dict)
    questions: int = 0  # early questions asked
    exact: int = 0  # of them, answered with the value alone
    errors: int = 0
    # of them, a context-length 400 (the tier's window; vLLM's "maximum context length")
    context_errors: int = 0
    summaries: int = 0  # fresh summaries written
    fallbacks: int = 0  # a model summary asked, the extractive one given
    cache_hits: float = 0.0  # prefix-cache tokens (vLLM's counters; the real stack only)
    cache_queries: float = 0.0
    sessions: int = 0
    extending: list[bool] = field(default_factory=list)  # per step after a session's first
    shared: list[float] = field(default_factory=list)  # share of the previous prompt kept

    def answered(self, family: str, early: list[Score], end: list[Score]) -> None:
        """A session's scored questions: its early ones and its end task's."""
        if early:
            share = sum(s.normalised for s in early) / len(early)
            self.outcomes.append(share)
            self.by_family.setdefault(family, []).append(share)
            self.questions += len(early)
            self.exact += sum(s.exact for s in early)
        if end:
            self.end.append(all(s.normalised for s in end))

    def merge(self, other: Tally) -> None:
        """Adds ``other`` (a session's tally, or a batch's) to this one: lists extended in
        order, counts summed, so a run tallied per session reads as one tallied whole."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            if isinstance(mine, list):
                mine.extend(theirs)
            elif isinstance(mine, dict):
                for key, values in theirs.items():
                    mine.setdefault(key, []).extend(values)
            else:
                setattr(self, f.name, mine + theirs)

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> Tally:
        """The tally ``dataclasses.asdict`` wrote (bench.context's ``--records`` lines)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    def row(self, base: Tally | None) -> dict[str, Any]:
        tokens = statistics.fmean(self.prompt_tokens) if self.prompt_tokens else 0.0
        out: dict[str, Any] = {
            "ms_per_step": round(statistics.fmean(self.ms), 1) if self.ms else 0.0,
            "p95_ms": round(_p95(self.ms), 1),
            "ms_per_answer": round(statistics.fmean(self.answer_ms), 1) if self.answer_ms else 0,
            "prompt_tokens_per_step": round(tokens, 1),
            "prompt_tokens_total": sum(self.prompt_tokens),
            "accuracy": _mean(self.outcomes),
            "accuracy_ci95": bootstrap_ci(self.outcomes),
            "exact": ratio(self.exact, self.questions) or 0.0,
            "end_task": _mean(self.end) if self.end else None,
            "end_task_ci95": bootstrap_ci(self.end) if self.end else None,
            "by_family": {f: {"accuracy": _mean(v), "accuracy_ci95": bootstrap_ci(v),
                              "sessions": len(v)} for f, v in sorted(self.by_family.items())},
            "prefix_cache_hit_rate": ratio(self.cache_hits, self.cache_queries),
            "errors": self.errors,
            "summaries": self.summaries,
            "summaries_per_session": ratio(self.summaries, self.sessions),
            "extends_previous": ratio(sum(self.extending), len(self.extending)),
            "prefix_shared": round(statistics.fmean(self.shared), 3) if self.shared else None,
            "fallbacks": self.fallbacks,
        }  # fmt: skip
        if base is not None:
            b = base.row(None)
            out["time_vs_none"] = ratio(out["ms_per_step"], b["ms_per_step"])
            out["tokens_vs_none"] = ratio(
                out["prompt_tokens_per_step"], b["prompt_tokens_per_step"]
            )
            out["accuracy_vs_none"] = ratio(out["accuracy"], b["accuracy"])
            # paired over sessions: every arm's outcomes are per session, in session order
            out["accuracy_vs_none_ci95"] = paired_ratio_ci(self.outcomes, base.outcomes)
            if out["end_task"] is not None:
                out["end_task_vs_none"] = ratio(out["end_task"], b["end_task"] or 0.0)
        return out


def _mean(values: Sequence[float]) -> float:
    return round(sum(values) / len(values), 3) if values else 0.0


def _p95(values: list[float]) -> float:
    return sorted(values)[int(0.95 * (len(values) - 1))] if values else 0.0


def ratio(a: float, b: float) -> float | None:
    return round(a / b, 3) if b else None
