"""What ``bench.context`` measures besides time and tokens: the answer's score, a
bootstrap interval over sessions, and vLLM's prefix-cache counters.

* ``score`` reads a model's answer the way a checker of ``QUESTION: what number goes with
  <key>?`` would: ``exact`` when the whole answer, stripped of spaces, quotes and a final
  full stop, is the value; ``normalised`` when the first number in it (thousands separators
  removed) is the value. A model that lists several numbers is not credited for a later one.
* ``bootstrap_ci`` resamples sessions (one score per session) with a seeded generator.
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
from dataclasses import dataclass

import httpx

NUMBER_RE = re.compile(r"\d[\d,]*")
METRIC_RE = re.compile(r"^vllm:prefix_cache_(hits|queries)(?:_total)?(?:\{[^}]*\})?\s+(\S+)$", re.M)


@dataclass(frozen=True)
class Score:
    exact: bool
    normalised: bool


def score(answer: str, value: str) -> Score:
    """The answer against the fact's value (a string of digits)."""
    bare = answer.strip().rstrip(".").strip("\"'` ")
    first = NUMBER_RE.search(answer)
    number = first.group(0).replace(",", "") if first else ""
    return Score(exact=bare == value, normalised=number == value)


def bootstrap_ci(outcomes: list[bool], *, rounds: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The 95% percentile interval of the mean of ``outcomes`` (one per session)."""
    if not outcomes:
        return (0.0, 0.0)
    rng, n = random.Random(seed), len(outcomes)
    means = sorted(sum(rng.choices(outcomes, k=n)) / n for _ in range(rounds))
    return (round(means[int(0.025 * rounds)], 3), round(means[int(0.975 * rounds) - 1], 3))


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
